//! A crash in the middle of a log truncation that removes whole segments (the `truncate`
//! failpoint stops it right after its first removal) leaves a log that opens: gap-free, longer
//! than asked, every frame as written. Removing the first segments first left a hole that
//! recovery refuses, and the node could not restart. Its own test binary: failpoints are armed
//! for the whole process.

use journal::segment::{FrameHeader, SegmentLog, encode_frame};

const SMALL_SEGMENT_BYTES: u64 = 512;
const FRAMES: u64 = 60;

fn header(index: u64) -> FrameHeader {
    FrameHeader {
        index,
        term: 1,
        node: 1,
        time_ms: 1_000 + index as i64,
        first_record: index,
        count: 1,
    }
}

fn payload(index: u64) -> Vec<u8> {
    vec![index as u8; 100]
}

#[test]
fn a_crash_inside_a_truncation_leaves_a_log_that_opens() {
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("FAILPOINTS");
    assert!(journal::failpoint::arm(trigger.clone()), "armed twice");
    let logs = dir.path().join("log");
    let (mut log, _) = SegmentLog::open(&logs, 0, 0, 0).unwrap();
    log.set_segment_target_bytes(SMALL_SEGMENT_BYTES);
    for i in 0..FRAMES {
        let mut frame = Vec::new();
        let h = header(i);
        encode_frame(&mut frame, &h, &payload(i));
        log.append(&[h], &frame).unwrap();
    }
    log.sync().unwrap();
    let segments = || {
        std::fs::read_dir(&logs)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "seg")
            })
            .count()
    };
    let before = segments();
    assert!(before >= 4, "{before} segments: the cut must span several");

    std::fs::write(&trigger, "truncate").unwrap();
    assert!(
        log.truncate(3).is_err(),
        "the failpoint stops the truncation"
    );
    drop(log);
    std::fs::remove_file(&trigger).unwrap();
    assert_eq!(
        segments(),
        before - 1,
        "one segment removed before the crash"
    );

    let (log, _) = SegmentLog::open(&logs, 0, 0, 0).expect("the log opens after the crash");
    let next = log.next_index();
    assert!(next > 3 && next < FRAMES, "recovered up to {next}");
    for i in 0..next {
        let (h, bytes) = log.read(i).unwrap();
        assert_eq!((h, bytes), (header(i), payload(i)), "frame {i}");
    }
}
