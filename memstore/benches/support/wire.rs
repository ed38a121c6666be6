//! A `RangeView` encoded as a server answers it (a fixed header, the view's revision), into one
//! reused buffer: shared by the memstore bench and the `profile_ops` example (by path).

use api::etcdserverpb::ResponseHeader;
use memstore::RangeView;

/// The header every measured answer carries (its revision set from the answer).
pub const HEADER: ResponseHeader = ResponseHeader {
    cluster_id: 0x1234_5678_9abc_def0,
    member_id: 0x0fed_cba9_8765_4321,
    revision: 0,
    raft_term: 7,
};

/// Encodes answers into one buffer it keeps.
pub struct WireEncoder {
    header: ResponseHeader,
    out: Vec<u8>,
}

impl WireEncoder {
    pub fn new() -> Self {
        WireEncoder {
            header: HEADER,
            out: Vec::new(),
        }
    }

    /// Encodes `view` in place of the previous answer; its length in bytes.
    pub fn encode(&mut self, view: &RangeView<'_>) -> usize {
        let h = ResponseHeader {
            revision: view.revision(),
            ..self.header
        };
        self.out.clear();
        view.encode_raw(&h, &mut self.out);
        self.out.len()
    }
}
