//! Storage property tests of the segment log against a naive model (a Vec of records): random
//! appends, syncs and purges, then a crash cut at a random byte offset after the last sync (or
//! a garbage tail); recovery must give a prefix of what was written that holds every synced
//! record, and nothing invented. Damage before the tail must stop the log from opening.
//! Replay one case with `STRATA_SEED=<seed> cargo test -p strata-journal --test segment_recovery`.

use std::path::{Path, PathBuf};

use journal::segment::{FrameHeader, SegmentError, SegmentLog, encode_frame};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Random cases per run (plus the pinned seed).
const CASES: u64 = 60;
const PINNED_SEED: u64 = 0x5eed_0001;
const SMALL_SEGMENT_BYTES: u64 = 2048;

fn header(index: u64) -> FrameHeader {
    FrameHeader {
        index,
        term: 1 + index / 50,
        node: 1,
        time_ms: 1_000 + index as i64,
        first_record: index,
        count: 1,
    }
}

fn payload(rng: &mut StdRng) -> Vec<u8> {
    let n = rng.random_range(0..300);
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

fn append(log: &mut SegmentLog, model: &mut Vec<Vec<u8>>, first: u64, payloads: Vec<Vec<u8>>) {
    let mut frames = Vec::new();
    let mut headers = Vec::new();
    for p in payloads {
        let h = header(first + model.len() as u64);
        encode_frame(&mut frames, &h, &p);
        headers.push(h);
        model.push(p);
    }
    log.append(&headers, &frames).unwrap();
}

fn last_segment(dir: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v.pop().unwrap()
}

fn check(log: &SegmentLog, model: &[Vec<u8>], first: u64, synced: usize, seed: u64) -> usize {
    let n = (log.next_index() - first) as usize;
    assert!(
        n >= synced,
        "seed {seed}: lost synced records: recovered {n} < synced {synced}"
    );
    assert!(
        n <= model.len(),
        "seed {seed}: invented records: {n} > written {}",
        model.len()
    );
    assert_eq!(log.first_index(), first, "seed {seed}");
    for (i, want) in model.iter().enumerate().take(n) {
        let (h, rest) = log.read(first + i as u64).unwrap();
        assert_eq!(
            h,
            header(first + i as u64),
            "seed {seed}: header of record {i}"
        );
        assert_eq!(&rest, want, "seed {seed}: bytes of record {i}");
    }
    n
}

fn run_case(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = SegmentLog::open(dir.path(), 0, 0, 0).unwrap();
    log.set_segment_target_bytes(SMALL_SEGMENT_BYTES);
    let mut first = 0u64;
    let mut model: Vec<Vec<u8>> = Vec::new(); // records from `first` on
    let mut synced = 0usize; // how many of `model` are known durable
    let mut synced_len: Option<(PathBuf, u64)> = None;
    for _ in 0..rng.random_range(1..60) {
        match rng.random_range(0..10) {
            0..=5 => {
                let k = rng.random_range(1..5);
                let ps = (0..k).map(|_| payload(&mut rng)).collect();
                append(&mut log, &mut model, first, ps);
            }
            6..=8 => {
                log.sync().unwrap();
                synced = model.len();
                let p = last_segment(dir.path());
                let len = std::fs::metadata(&p).unwrap().len();
                synced_len = Some((p, len));
            }
            _ => {
                // Purge a synced prefix (the meta file is the caller's business here).
                if synced > 1 {
                    let k = rng.random_range(1..synced);
                    log.purge(first + k as u64 - 1).unwrap();
                    model.drain(..k);
                    synced -= k;
                    first += k as u64;
                }
            }
        }
    }
    drop(log);
    // Crash: cut the last segment at a random offset at or after what was synced (a segment
    // started after the last sync holds nothing promised), or leave garbage after the tail.
    let last = last_segment(dir.path());
    let len = std::fs::metadata(&last).unwrap().len();
    let floor = match &synced_len {
        Some((p, l)) if *p == last => *l,
        _ => 0,
    };
    if rng.random_bool(0.8) {
        let cut = rng.random_range(floor..=len);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&last)
            .unwrap()
            .set_len(cut)
            .unwrap();
    } else {
        let mut garbage = vec![0u8; rng.random_range(1..64)];
        rng.fill_bytes(&mut garbage);
        let mut bytes = std::fs::read(&last).unwrap();
        bytes.extend_from_slice(&garbage);
        std::fs::write(&last, bytes).unwrap();
    }
    let (log, _) = SegmentLog::open(dir.path(), first, 0, first)
        .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    let n = check(&log, &model, first, synced, seed);
    // The recovered log takes appends again and survives a clean reopen.
    model.truncate(n);
    let mut log = log;
    append(&mut log, &mut model, first, vec![b"after".to_vec()]);
    log.sync().unwrap();
    drop(log);
    let (log, report) = SegmentLog::open(dir.path(), first, 0, first).unwrap();
    assert_eq!(report.torn_tail_cut_bytes, 0, "seed {seed}");
    assert_eq!(check(&log, &model, first, model.len(), seed), model.len());
}

#[test]
fn pinned_seed() {
    run_case(PINNED_SEED);
}

#[test]
fn random_crash_cuts_recover_a_synced_prefix() {
    let base = std::env::var("STRATA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let cases = if std::env::var("STRATA_SEED").is_ok() {
        1
    } else {
        CASES
    };
    for i in 0..cases {
        let seed = base.wrapping_add(i);
        eprintln!("segment_recovery case seed {seed} (replay: STRATA_SEED={seed})");
        run_case(seed);
    }
}

fn filled_log(dir: &Path, records: u64) -> Vec<Vec<u8>> {
    let (mut log, _) = SegmentLog::open(dir, 0, 0, 0).unwrap();
    log.set_segment_target_bytes(SMALL_SEGMENT_BYTES);
    let mut model = Vec::new();
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..records {
        let p = payload(&mut rng);
        append(&mut log, &mut model, 0, vec![p]);
    }
    log.sync().unwrap();
    model
}

#[test]
fn corruption_in_an_older_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    filled_log(dir.path(), 100);
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    assert!(segs.len() > 2, "want several segments");
    let mut b = std::fs::read(&segs[0]).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x01;
    std::fs::write(&segs[0], b).unwrap();
    match SegmentLog::open(dir.path(), 0, 0, 0) {
        Err(SegmentError::Corrupt { .. }) => {}
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("opened a corrupt log"),
    }
}

/// A log in `dir` holding 20 synced records of 40 bytes, and its model.
fn twenty_synced_records(dir: &Path) -> (SegmentLog, Vec<Vec<u8>>) {
    let (mut log, _) = SegmentLog::open(dir, 0, 0, 0).unwrap();
    let mut model = Vec::new();
    for i in 0..20u8 {
        append(&mut log, &mut model, 0, vec![vec![i; 40]]);
    }
    log.sync().unwrap();
    (log, model)
}

#[test]
fn corruption_before_valid_records_of_the_last_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(twenty_synced_records(dir.path()));
    let seg = last_segment(dir.path());
    let mut b = std::fs::read(&seg).unwrap();
    b[8 + 8 + 48 + 3] ^= 0xff; // inside the first record's payload
    std::fs::write(&seg, b).unwrap();
    let err = SegmentLog::open(dir.path(), 0, 0, 0)
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("not a torn tail"), "{err}");
}

/// A torn last frame whose payload holds bytes shaped like a valid frame (a tenant's value can
/// hold anything) is still a torn tail: the frame inside it carries an index no frame at that
/// distance could have.
#[test]
fn a_frame_shaped_value_inside_a_torn_tail_is_not_taken_for_a_later_frame() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, mut model) = twenty_synced_records(dir.path());
    let mut inner = Vec::new();
    encode_frame(&mut inner, &header(1 << 35), b"crafted");
    let mut value = vec![0u8; 100];
    value.extend_from_slice(&inner);
    value.extend_from_slice(&[0u8; 400]);
    append(&mut log, &mut model, 0, vec![value]);
    log.sync().unwrap();
    drop(log);
    // A crash cut the last frame short after the frame-shaped bytes.
    let seg = last_segment(dir.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    file.set_len(len - 200).unwrap();
    drop(file);
    let (log, report) = SegmentLog::open(dir.path(), 0, 0, 0).expect("a torn tail is cut");
    assert_eq!(log.next_index(), 20);
    assert!(report.torn_tail_cut_bytes > 0);
}

#[test]
fn truncate_then_append_replaces_the_suffix() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = filled_log(dir.path(), 60);
    let (mut log, _) = SegmentLog::open(dir.path(), 0, 0, 0).unwrap();
    log.set_segment_target_bytes(SMALL_SEGMENT_BYTES);
    log.truncate(25).unwrap();
    model.truncate(25);
    append(
        &mut log,
        &mut model,
        0,
        vec![b"new".to_vec(), b"newer".to_vec()],
    );
    log.sync().unwrap();
    drop(log);
    let (log, _) = SegmentLog::open(dir.path(), 0, 0, 0).unwrap();
    assert_eq!(check(&log, &model, 0, model.len(), 0), 27);
}

#[test]
fn records_of_multi_record_entries_are_located_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = SegmentLog::open(dir.path(), 0, 0, 0).unwrap();
    log.set_segment_target_bytes(SMALL_SEGMENT_BYTES);
    // Entries of 1, 3, 1, 5, ... records: entry i starts where entry i-1 ended.
    let mut starts = Vec::new();
    for i in 0..40u64 {
        let h = FrameHeader {
            index: i,
            term: 1,
            node: 1,
            time_ms: i as i64,
            first_record: log.next_record(),
            count: 1 + (i % 3) as u32 * 2,
        };
        starts.push((h.first_record, h.end_record()));
        let mut frames = Vec::new();
        encode_frame(&mut frames, &h, &[i as u8; 100]);
        log.append(&[h], &frames).unwrap();
    }
    log.sync().unwrap();
    let check = |log: &SegmentLog| {
        for (i, (first, end)) in starts.iter().enumerate() {
            for r in *first..*end {
                let h = log.entry_of_record(r).unwrap();
                assert_eq!(h.index, i as u64, "record {r}");
            }
        }
        assert!(log.entry_of_record(starts.last().unwrap().1).is_none());
        assert_eq!(log.next_record(), starts.last().unwrap().1);
    };
    check(&log);
    drop(log);
    let (mut log, _) = SegmentLog::open(dir.path(), 0, 0, 0).unwrap();
    check(&log);
    // A frame that does not start where the previous ended is refused on append.
    let h = FrameHeader {
        index: 40,
        term: 1,
        node: 1,
        time_ms: 40,
        first_record: log.next_record() + 1,
        count: 1,
    };
    let mut frames = Vec::new();
    encode_frame(&mut frames, &h, b"x");
    assert!(log.append(&[h], &frames).is_err());
    // After purging a prefix, an emptied log continues from the purged entry's record end.
    log.purge(39).unwrap();
    assert_eq!(log.first_record(), starts[39].1);
    assert_eq!(log.next_record(), starts[39].1);
}

#[test]
fn a_version_1_segment_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = journal::segment::SEGMENT_MAGIC_V1.to_vec();
    old.extend_from_slice(&[0u8; 64]);
    std::fs::write(dir.path().join(format!("{:020}.seg", 0)), old).unwrap();
    let err = SegmentLog::open(dir.path(), 0, 0, 0)
        .err()
        .expect("must refuse an old format");
    assert!(matches!(err, SegmentError::OldFormat { .. }), "{err}");
    assert!(err.to_string().contains("format version 1"), "{err}");
}
