//! `RangeView`: a Range answer that borrows the store's bytes, encoded straight into etcd's
//! wire format (a point read then costs one copy of its key and value, into the caller's
//! buffer, and no allocation of its own) or turned into the owned `RangeResponse`.

use api::etcdserverpb::{RangeResponse, ResponseHeader};
use prost::Message;
use prost::bytes::BufMut;
use prost::encoding::encoded_len_varint;

use crate::keyspace::Version;

/// Protobuf wire types used here.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// Field numbers of etcd's messages (rpc.proto, kv.proto), each below 16 so its key is one
/// byte.
const RANGE_RESPONSE_HEADER: u8 = 1;
const RANGE_RESPONSE_KVS: u8 = 2;
const RANGE_RESPONSE_COUNT: u8 = 4;
const HEADER_CLUSTER_ID: u8 = 1;
const HEADER_MEMBER_ID: u8 = 2;
const HEADER_REVISION: u8 = 3;
const HEADER_RAFT_TERM: u8 = 4;
const KV_KEY: u8 = 1;
const KV_CREATE_REVISION: u8 = 2;
const KV_MOD_REVISION: u8 = 3;
const KV_VERSION: u8 = 4;
const KV_VALUE: u8 = 5;
const KV_LEASE: u8 = 6;

/// The one-byte key of field `field` with wire type `wire`.
const fn tag(field: u8, wire: u8) -> u8 {
    (field << 3) | wire
}

/// The answer to a Range request, borrowing the store (`MemStore::range_view`). A point read
/// (no `range_end`) holds the key's version itself; any other range holds the response the
/// general path built.
#[derive(Debug)]
pub struct RangeView<'a> {
    inner: Inner<'a>,
}

#[derive(Debug)]
enum Inner<'a> {
    Point(Point<'a>),
    /// A range's response, its header taken out (the caller gives the header).
    Owned {
        revision: i64,
        resp: RangeResponse,
    },
}

/// A point read's answer: the key-value to return (if it exists at the revision, passes the
/// filters and the request wants it), and the count (before the filters, as etcd counts).
#[derive(Debug)]
struct Point<'a> {
    revision: i64,
    kv: Option<(&'a [u8], &'a Version)>,
    keys_only: bool,
    count: i64,
}

impl<'a> RangeView<'a> {
    pub(crate) fn point(
        revision: i64,
        kv: Option<(&'a [u8], &'a Version)>,
        keys_only: bool,
        count: i64,
    ) -> RangeView<'a> {
        RangeView {
            inner: Inner::Point(Point {
                revision,
                kv,
                keys_only,
                count,
            }),
        }
    }

    pub(crate) fn owned(revision: i64, mut resp: RangeResponse) -> RangeView<'a> {
        resp.header = None;
        RangeView {
            inner: Inner::Owned { revision, resp },
        }
    }

    /// The header revision of the answer: the store's revision when it was read (as etcd's,
    /// not the revision read at).
    pub fn revision(&self) -> i64 {
        match &self.inner {
            Inner::Point(p) => p.revision,
            Inner::Owned { revision, .. } => *revision,
        }
    }

    /// The owned response `MemStore::range` answers (header: this view's revision only).
    pub fn into_response(self) -> RangeResponse {
        let header = Some(ResponseHeader {
            revision: self.revision(),
            ..Default::default()
        });
        match self.inner {
            Inner::Point(p) => RangeResponse {
                header,
                kvs: match p.kv {
                    Some((k, v)) => vec![v.to_kv(k, p.keys_only)],
                    None => Vec::new(),
                },
                more: false,
                count: p.count,
            },
            Inner::Owned { mut resp, .. } => {
                resp.header = header;
                resp
            }
        }
    }

    /// Length of the encoded `RangeResponse` with `header` as its header (the gRPC message
    /// length, without any prefix).
    pub fn encoded_len(&self, header: &ResponseHeader) -> usize {
        let header_len = header_body_len(header);
        let header_field = 1 + encoded_len_varint(header_len as u64) + header_len;
        match &self.inner {
            Inner::Point(p) => {
                let kv = p.kv.map_or(0, |(k, v)| {
                    let n = kv_body_len(k, v, p.keys_only);
                    1 + encoded_len_varint(n as u64) + n
                });
                header_field + kv + int_field_len(p.count)
            }
            Inner::Owned { resp, .. } => header_field + resp.encoded_len(),
        }
    }

    /// Appends the `RangeResponse` with `header` as its header, byte for byte as prost encodes
    /// the response `into_response` gives with that header (fields in number order, zero
    /// values left out). `buf` grows as it must; size it with `encoded_len` first.
    pub fn encode_raw(&self, header: &ResponseHeader, buf: &mut impl BufMut) {
        // Tags and varints are gathered in `Scratch` and written a run at a time: a `BufMut`
        // write per byte (a capacity check and a length update each) cost more than the rest
        // of a cached point read together.
        let mut s = Scratch::new();
        s.len_prefix(RANGE_RESPONSE_HEADER, header_body_len(header));
        s.uint(HEADER_CLUSTER_ID, header.cluster_id);
        s.uint(HEADER_MEMBER_ID, header.member_id);
        s.uint(HEADER_REVISION, header.revision as u64);
        s.uint(HEADER_RAFT_TERM, header.raft_term);
        match &self.inner {
            Inner::Point(p) => {
                if let Some((k, v)) = p.kv {
                    s.len_prefix(RANGE_RESPONSE_KVS, kv_body_len(k, v, p.keys_only));
                    s.bytes(KV_KEY, k, buf);
                    s.uint(KV_CREATE_REVISION, v.create as u64);
                    s.uint(KV_MOD_REVISION, v.main as u64);
                    s.uint(KV_VERSION, v.version as u64);
                    if !p.keys_only {
                        s.bytes(KV_VALUE, &v.value, buf);
                    }
                    s.uint(KV_LEASE, v.lease as u64);
                }
                // `more` is always false for one key: left out, as prost leaves it out.
                s.uint(RANGE_RESPONSE_COUNT, p.count as u64);
                s.flush(buf);
            }
            Inner::Owned { resp, .. } => {
                s.flush(buf);
                resp.encode_raw(buf);
            }
        }
    }

    /// The encoded `RangeResponse` in a vector of exactly its length.
    pub fn encode_to_vec(&self, header: &ResponseHeader) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len(header));
        self.encode_raw(header, &mut out);
        out
    }
}

/// Bytes of a varint field (key + value); 0 for a zero value, which proto3 leaves out.
fn int_field_len(v: i64) -> usize {
    if v == 0 {
        0
    } else {
        1 + encoded_len_varint(v as u64)
    }
}

/// Bytes of a `bytes` field; 0 when empty.
fn bytes_field_len(b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        1 + encoded_len_varint(b.len() as u64) + b.len()
    }
}

fn header_body_len(h: &ResponseHeader) -> usize {
    int_field_len(h.cluster_id as i64)
        + int_field_len(h.member_id as i64)
        + int_field_len(h.revision)
        + int_field_len(h.raft_term as i64)
}

/// Length of the `KeyValue` message `Version::to_kv(k, keys_only)` would encode to.
fn kv_body_len(k: &[u8], v: &Version, keys_only: bool) -> usize {
    bytes_field_len(k)
        + int_field_len(v.create)
        + int_field_len(v.main)
        + int_field_len(v.version)
        + if keys_only {
            0
        } else {
            bytes_field_len(&v.value)
        }
        + int_field_len(v.lease)
}

/// Bytes `Scratch` holds: everything but the key and value bytes of one answer, should no
/// flush come between (the header field with its four varints, the `kvs` prefix, the key and
/// value prefixes, three revision fields, lease and count: 2 + 4 x 11 + 6 + 6 + 3 x 11 + 6 +
/// 2 x 11 = 119 bytes).
const SCRATCH: usize = 128;

/// Tags and varints gathered on the stack, written to the buffer with one `put_slice` before
/// each run of key or value bytes and at the end.
struct Scratch {
    bytes: [u8; SCRATCH],
    len: usize,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            bytes: [0; SCRATCH],
            len: 0,
        }
    }

    #[inline]
    fn byte(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    #[inline]
    fn varint(&mut self, mut v: u64) {
        let mut at = self.len;
        while v >= 0x80 {
            self.bytes[at] = v as u8 | 0x80;
            v >>= 7;
            at += 1;
        }
        self.bytes[at] = v as u8;
        self.len = at + 1;
    }

    /// A varint field; nothing for 0, which proto3 leaves out.
    #[inline]
    fn uint(&mut self, field: u8, v: u64) {
        if v != 0 {
            self.byte(tag(field, VARINT));
            self.varint(v);
        }
    }

    /// The tag and length of a length-delimited field whose body follows.
    #[inline]
    fn len_prefix(&mut self, field: u8, len: usize) {
        self.byte(tag(field, LEN));
        self.varint(len as u64);
    }

    /// A `bytes` field (nothing when empty): its prefix, then the bytes straight from `b`.
    fn bytes(&mut self, field: u8, b: &[u8], buf: &mut impl BufMut) {
        if !b.is_empty() {
            self.len_prefix(field, b.len());
            self.flush(buf);
            buf.put_slice(b);
        }
    }

    fn flush(&mut self, buf: &mut impl BufMut) {
        buf.put_slice(&self.bytes[..self.len]);
        self.len = 0;
    }
}
