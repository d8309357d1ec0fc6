//! dynamo-kv-router's concurrent tree (`ConcurrentRadixTreeCompressed`) in the
//! writer + reader mode. Its event-apply function is private: events reach it
//! only through `SyncIndexer::worker`, a loop that drains a flume channel on the
//! caller's thread. So the writer thread here is that worker loop over a channel
//! pre-filled (untimed) with every store/remove event in stream order; the
//! reader follows the writer's progress through the channel's remaining length.

use crate::peers::dynamo_event;
use crate::workload::{Op, Workload};
use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::SyncIndexer;
use dynamo_kv_router::indexer::WorkerTask;
use dynamo_kv_router::protocols::LocalBlockHash;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const CRTC: &str = "dynamo-kv-router 1.6.1 ConcurrentRadixTreeCompressed";

pub struct Outcome {
    pub elapsed: Duration,
    pub hist: Histogram<u64>,
    pub final_mismatches: u64,
}

/// Live bytes of the tree after the store/remove stream, taken while its
/// worker loop is still running (the loop keeps the per-worker block lookup
/// map, part of the index state, as a local it frees on return). Events go
/// through a bounded channel (converted one at a time); a final removal of an
/// unknown hash is the sentinel: once the channel is empty the worker has
/// taken it, so every real event before it has been applied. The channel's
/// fixed buffer (`CAP` slots) is subtracted.
pub fn memory(w: &Workload) -> f64 {
    const CAP: usize = 256;
    let before = crate::alloc::live();
    let tree = ConcurrentRadixTreeCompressed::new();
    let (tx, rx) = flume::bounded(CAP);
    let bytes = std::thread::scope(|s| {
        let worker = s.spawn(|| tree.worker(rx, None).expect("crtc worker"));
        let mut id = 0u64;
        for op in &w.ops {
            if let Some(ev) = dynamo_event(op, w, id + 1) {
                id += 1;
                tx.send(WorkerTask::Event(ev)).expect("send");
            }
        }
        let sentinel = Op::Remove {
            replica: 0,
            seqs: vec![0x5e47_1e15_0000_0001],
        };
        tx.send(WorkerTask::Event(
            dynamo_event(&sentinel, w, id + 1).expect("event"),
        ))
        .expect("send");
        while !tx.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        let after = crate::alloc::live();
        drop(tx);
        worker.join().expect("worker");
        after
    });
    drop(tree);
    let chan = (CAP * std::mem::size_of::<WorkerTask>()) as f64;
    ((bytes - before) as f64 - chan) / w.final_entries as f64
}

fn lookup(
    tree: &ConcurrentRadixTreeCompressed,
    q: &[LocalBlockHash],
    out: &mut Vec<(u32, u32)>,
) -> u64 {
    let t = Instant::now();
    let res = SyncIndexer::find_matches(tree, q, false);
    let ns = t.elapsed().as_nanos() as u64;
    for (w, s) in res.scores {
        if s > 0 {
            out.push((w.worker_id as u32, s));
        }
    }
    ns
}

pub fn run(w: &Workload, recent: usize, hist: impl Fn() -> Histogram<u64> + Sync) -> Outcome {
    let tree = ConcurrentRadixTreeCompressed::new();
    let (tx, rx) = flume::unbounded();
    // op index of the k-th event, for the reader's progress
    let mut event_op = Vec::new();
    for (i, op) in w.ops.iter().enumerate() {
        if let Some(ev) = dynamo_event(op, w, event_op.len() as u64 + 1) {
            event_op.push(i);
            tx.send(WorkerTask::Event(ev)).expect("send");
        }
    }
    drop(tx);
    let total = event_op.len();
    let queries: Vec<Vec<LocalBlockHash>> = w
        .chains
        .iter()
        .map(|c| c.content.iter().map(|&h| LocalBlockHash(h)).collect())
        .collect();
    let lookups: Vec<usize> = w
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| matches!(op, Op::Lookup { .. }).then_some(i))
        .collect();
    let reqs: Vec<usize> = w
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Lookup { req, .. } => Some(*req),
            _ => None,
        })
        .collect();
    let done = AtomicBool::new(false);
    let probe = rx.clone();
    let (elapsed, h) = std::thread::scope(|s| {
        let rd = s.spawn(|| {
            let mut h = hist();
            let mut got = Vec::new();
            let mut k = 0usize;
            let mut empty = 0u64;
            while !done.load(Ordering::Acquire) {
                let applied = total - probe.len().min(total);
                // the worker has taken `applied` events: lookups before the last
                // taken event are eligible (as in the other indexes' threaded mode)
                let pos = if applied == 0 {
                    0
                } else {
                    event_op[applied - 1] + 1
                };
                let upto = lookups.partition_point(|&i| i < pos);
                if upto == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let j = upto - 1 - (k % recent).min(upto - 1);
                k += 1;
                got.clear();
                let ns = lookup(&tree, &queries[reqs[j]], &mut got);
                h.record(ns.max(1)).ok();
                if got.is_empty() {
                    empty += 1;
                }
            }
            if empty > 0 {
                eprintln!(
                    "  {CRTC}: {empty} of {} concurrent lookups matched nothing",
                    h.len()
                );
            }
            h
        });
        let t = Instant::now();
        tree.worker(rx, None).expect("crtc worker");
        let elapsed = t.elapsed();
        done.store(true, Ordering::Release);
        (elapsed, rd.join().expect("reader"))
    });
    drop(probe);
    drop(queries);
    let mut bad = 0;
    let mut got = Vec::new();
    for (req, c) in w.chains.iter().enumerate() {
        if c.seq.is_empty() {
            continue;
        }
        got.clear();
        let q: Vec<LocalBlockHash> = c.content.iter().map(|&h| LocalBlockHash(h)).collect();
        lookup(&tree, &q, &mut got);
        got.sort_unstable();
        if got != w.final_expected(req) {
            bad += 1;
        }
    }
    Outcome {
        elapsed,
        hist: h,
        final_mismatches: bad,
    }
}
