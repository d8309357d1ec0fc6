//! Peer comparison: our prefix index vs `kv-index` 2.0.0 (`ChainIndex`) vs
//! `dynamo-kv-router` 1.6.1 (`RadixTree`) on one deterministic replay of the
//! Mooncake conversation trace. See README.md.

mod alloc;
mod crtc;
mod peers;
mod workload;

use hdrhistogram::Histogram;
use peers::Engine;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use workload::{Op, Workload};

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

struct Args {
    trace: String,
    replicas: usize,
    cache_blocks: usize,
    scale: usize,
    requests: usize,
    threaded: bool,
    repeat: usize,
    only: Option<String>,
}

fn parse_args() -> Args {
    let mut a = Args {
        trace: "/work/shared/data/mooncake/conversation_trace.jsonl".into(),
        replicas: 8,
        cache_blocks: 20_000,
        scale: 1,
        requests: 0,
        threaded: true,
        repeat: 3,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--trace" => a.trace = v(),
            "--replicas" => a.replicas = v().parse().expect("--replicas"),
            "--cache-blocks" => a.cache_blocks = v().parse().expect("--cache-blocks"),
            "--scale" => a.scale = v().parse().expect("--scale"),
            "--requests" => a.requests = v().parse().expect("--requests"),
            "--no-threaded" => a.threaded = false,
            "--only" => a.only = Some(v()),
            "--repeat" => a.repeat = v().parse().expect("--repeat"),
            "-h" | "--help" => {
                println!(
                    "bench-peers [--trace PATH] [--replicas N] [--cache-blocks N] [--scale K] \
                     [--requests N (0 = all)] [--no-threaded] [--repeat N (default 3)] [--only ours|kv-index|dynamo|arena[,...]] (name prefixes: \"ours\" runs every row of ours)\n\
                     --scale K duplicates the trace K times (hash ids offset per copy, copies \
                     interleaved by timestamp) and multiplies the replica count by K."
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(a.repeat >= 1 && a.scale >= 1 && a.replicas >= 1 && a.cache_blocks >= 1);
    a
}

#[derive(Default, Clone)]
struct Row {
    name: &'static str,
    mode: &'static str,
    events_per_s: f64,
    p50: u64,
    p99: u64,
    p999: u64,
    lookups: u64,
    bytes_per_entry: Option<f64>,
    mismatches: Option<u64>,
    errors: u64,
    note: String,
    hist: Option<Histogram<u64>>,
}

/// Merge repeated runs: median events/s, pooled lookup histogram, summed counts.
fn combine(mut runs: Vec<Row>) -> Row {
    runs.sort_by(|a, b| a.events_per_s.total_cmp(&b.events_per_s));
    let mut out = runs[runs.len() / 2].clone();
    let mut h = hist();
    let (mut mm, mut errors) = (None, 0);
    for r in &runs {
        if let Some(x) = &r.hist {
            h.add(x).ok();
        }
        if let Some(m) = r.mismatches {
            mm = Some(mm.unwrap_or(0) + m);
        }
        errors += r.errors;
    }
    out.p50 = h.value_at_quantile(0.5);
    out.p99 = h.value_at_quantile(0.99);
    out.p999 = h.value_at_quantile(0.999);
    out.lookups = h.len();
    out.mismatches = mm;
    out.errors = errors;
    out.hist = None;
    out
}

/// The reader of the threaded mode looks up the last RECENT routed requests.
const RECENT: usize = 64;

fn hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
}

/// Single-threaded: every op in stream order; lookups timed one by one and
/// compared with the generator's ground truth.
fn run_single(engine: &mut dyn Engine, w: &Workload) -> Row {
    engine.prepare(w);
    let mut h = hist();
    let mut write_time = Duration::ZERO;
    let mut mismatches = 0u64;
    let mut shown = 0;
    let mut got = Vec::new();
    for (i, op) in w.ops.iter().enumerate() {
        match op {
            Op::Lookup { req, expected } => {
                got.clear();
                let ns = engine.lookup(i, *req, &mut got);
                h.record(ns.max(1)).ok();
                got.sort_unstable();
                if engine.checked() && got != *expected {
                    mismatches += 1;
                    if shown < 3 {
                        shown += 1;
                        eprintln!(
                            "  {} mismatch at op {i}: expected {:?} got {:?}",
                            engine.name(),
                            expected,
                            got
                        );
                    }
                }
            }
            _ => {
                let t = Instant::now();
                engine.apply(i, op);
                write_time += t.elapsed();
            }
        }
    }
    Row {
        name: engine.name(),
        mode: "1 thread",
        events_per_s: w.block_events as f64 / write_time.as_secs_f64(),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        lookups: h.len(),
        mismatches: engine.checked().then_some(mismatches),
        errors: engine.errors(),
        hist: Some(h),
        ..Row::default()
    }
}

/// One writer thread applying every store/remove in order while one reader
/// thread cycles through the lookups until the writer is done.
fn run_threaded(engine: &mut dyn Engine, w: &Workload) -> Option<Row> {
    engine.prepare(w);
    let lookups: Vec<(usize, usize)> = w
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op {
            Op::Lookup { req, .. } => Some((i, *req)),
            _ => None,
        })
        .collect();
    let engine_name = engine.name();
    let (mut writer, reader) = engine.split()?;
    let done = AtomicBool::new(false);
    // Op index the writer has applied up to: the reader looks up requests that
    // were routed recently (the last RECENT lookups before the writer's
    // position), i.e. chains that are likely resident, as a gateway would.
    let pos = AtomicUsize::new(0);
    let (elapsed, h) = std::thread::scope(|s| {
        let rd = s.spawn(|| {
            let mut h = hist();
            let mut got = Vec::new();
            let mut k = 0usize;
            let mut empty = 0u64;
            while !done.load(Ordering::Acquire) {
                let p = pos.load(Ordering::Acquire);
                let upto = lookups.partition_point(|&(i, _)| i < p);
                if upto == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let (i, req) = lookups[upto - 1 - (k % RECENT).min(upto - 1)];
                k += 1;
                got.clear();
                let ns = reader.lookup(i, req, &mut got);
                h.record(ns.max(1)).ok();
                if got.is_empty() {
                    empty += 1;
                }
            }
            (h, empty)
        });
        let t = Instant::now();
        for (i, op) in w.ops.iter().enumerate() {
            if !matches!(op, Op::Lookup { .. }) {
                writer.apply(i, op);
                // published after writes only: a lookup is eligible once a write
                // after it has landed, so its own request's blocks are (being) stored
                pos.store(i + 1, Ordering::Release);
            }
        }
        let elapsed = t.elapsed();
        done.store(true, Ordering::Release);
        (elapsed, rd.join().expect("reader"))
    });
    let (h, empty) = h;
    if empty > 0 {
        eprintln!(
            "  {}: {empty} of {} concurrent lookups matched nothing",
            engine_name,
            h.len()
        );
    }
    drop(writer);
    drop(reader);
    let bad = engine.checked().then(|| final_check(engine, w));
    Some(Row {
        name: engine.name(),
        mode: "1 writer + 1 reader",
        events_per_s: w.block_events as f64 / elapsed.as_secs_f64(),
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        lookups: h.len(),
        errors: engine.errors(),
        mismatches: bad,
        hist: Some(h),
        ..Row::default()
    })
}

/// After a threaded run: every request's chain against the end-of-stream ground truth.
fn final_check(engine: &dyn Engine, w: &Workload) -> u64 {
    let mut bad = 0;
    let mut got = Vec::new();
    for req in 0..w.chains.len() {
        if w.chains[req].seq.is_empty() {
            continue;
        }
        got.clear();
        engine.lookup(usize::MAX, req, &mut got);
        got.sort_unstable();
        if got != w.final_expected(req) {
            bad += 1;
        }
    }
    bad
}

/// Live bytes held by the index after replaying the store/remove stream
/// (events converted one at a time and dropped, so only the index remains).
fn measure_memory(make: &dyn Fn() -> Box<dyn Engine>, w: &Workload) -> f64 {
    let before = alloc::live();
    let mut e = make();
    for op in &w.ops {
        if !matches!(op, Op::Lookup { .. }) {
            e.apply_unprepared(op, w);
        }
    }
    let after = alloc::live();
    drop(e);
    (after as f64 - before as f64) / w.final_entries as f64
}

fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else {
        format!("{:.0} k", v / 1e3)
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "| index | mode | store+remove block events/s | lookup p50 / p99 / p99.9 ns | lookups | bytes per entry | mismatches | ours/peer: events/s, p50, p99, bytes |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        if r.lookups == 0 && !r.note.is_empty() {
            println!(
                "| {} | {} | - | - | - | - | - | {} |",
                r.name, r.mode, r.note
            );
            continue;
        }
        let ours = rows
            .iter()
            .find(|o| o.name == peers::OURS && o.mode == r.mode);
        let ratio = match ours {
            Some(o) if !r.name.starts_with("ours") => {
                let b = match (o.bytes_per_entry, r.bytes_per_entry) {
                    (Some(a), Some(b)) => format!("{:.2}x", a / b),
                    _ => "-".into(),
                };
                format!(
                    "{:.2}x, {:.2}x, {:.2}x, {}",
                    o.events_per_s / r.events_per_s,
                    o.p50 as f64 / r.p50 as f64,
                    o.p99 as f64 / r.p99 as f64,
                    b
                )
            }
            _ => "-".into(),
        };
        let mm = r.mismatches.map_or("-".into(), |m| m.to_string());
        let bpe = r.bytes_per_entry.map_or("-".into(), |b| format!("{b:.1}"));
        let err = if r.errors > 0 {
            format!(" ({} apply errors)", r.errors)
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {}{} | {} / {} / {} | {} | {} | {} | {} |{}",
            r.name,
            r.mode,
            fmt_rate(r.events_per_s),
            err,
            r.p50,
            r.p99,
            r.p999,
            r.lookups,
            bpe,
            mm,
            ratio,
            if r.note.is_empty() {
                String::new()
            } else {
                format!(" {}", r.note)
            }
        );
    }
}

/// Builds a fresh index (one per run).
type MakeEngine = Box<dyn Fn() -> Box<dyn Engine>>;

fn main() {
    let args = parse_args();
    let t = Instant::now();
    let reqs = workload::load_trace(&args.trace, args.scale, args.requests);
    let w = workload::generate(&reqs, args.replicas * args.scale, args.cache_blocks);
    drop(reqs);
    eprintln!(
        "workload: {} requests (scale {}), {} replicas x {} blocks; ops {} ({} lookups, {} store + {} remove block events); \
         prefix hit {:.1}%; {} entries at end (peak {}); generated in {:.1}s",
        w.requests,
        args.scale,
        w.replicas,
        args.cache_blocks,
        w.ops.len(),
        w.lookups,
        w.stored_blocks,
        w.removed_blocks,
        100.0 * w.hit_blocks as f64 / w.request_blocks as f64,
        w.final_entries,
        w.peak_entries,
        t.elapsed().as_secs_f64()
    );

    let engines: Vec<(&'static str, MakeEngine)> = vec![
        (
            peers::OURS,
            Box::new(|| Box::new(peers::Ours::new(peers::Path::Probe)) as Box<dyn Engine>),
        ),
        (
            peers::OURS_CONTRACT,
            Box::new(|| Box::new(peers::Ours::new(peers::Path::Contract)) as Box<dyn Engine>),
        ),
        (
            peers::OURS_DEFAULT,
            Box::new(|| Box::new(peers::Ours::new(peers::Path::Default)) as Box<dyn Engine>),
        ),
        (
            peers::KVI,
            Box::new({
                let n = w.replicas;
                move || Box::new(peers::KvIndex::new(n)) as Box<dyn Engine>
            }),
        ),
        (
            peers::DYN,
            Box::new(|| Box::new(peers::Dynamo::new()) as Box<dyn Engine>),
        ),
        (
            peers::ARENA,
            Box::new(|| Box::new(peers::Arena::new()) as Box<dyn Engine>),
        ),
    ];
    let mut rows = Vec::new();
    for (name, make) in &engines {
        if let Some(only) = &args.only
            && !only.split(',').any(|o| name.starts_with(o))
        {
            continue;
        }
        let bpe = measure_memory(make.as_ref(), &w);
        eprintln!("{name}: {bpe:.1} bytes per entry");
        let mut runs = Vec::new();
        for _ in 0..args.repeat {
            let mut e = make();
            runs.push(run_single(e.as_mut(), &w));
        }
        let mut row = combine(runs);
        row.bytes_per_entry = Some(bpe);
        eprintln!(
            "{name} 1 thread: {} events/s, p50 {} p99 {} ns, mismatches {:?}",
            fmt_rate(row.events_per_s),
            row.p50,
            row.p99,
            row.mismatches
        );
        rows.push(row);
        if args.threaded {
            let mut runs = Vec::new();
            for _ in 0..args.repeat {
                let mut e = make();
                if let Some(r) = run_threaded(e.as_mut(), &w) {
                    runs.push(r);
                }
            }
            match (!runs.is_empty()).then(|| combine(runs)) {
                Some(mut r) => {
                    r.bytes_per_entry = Some(bpe);
                    eprintln!(
                        "{name} threaded: writer {} events/s, reader p50 {} p99 {} ns",
                        fmt_rate(r.events_per_s),
                        r.p50,
                        r.p99
                    );
                    rows.push(r)
                }
                None => rows.push(Row {
                    name,
                    mode: "1 writer + 1 reader",
                    note: "skipped: RadixTree is Rc<RefCell> (!Send), cannot be shared even behind a Mutex".into(),
                    ..Row::default()
                }),
            }
        }
    }
    let want_crtc = args.threaded
        && args
            .only
            .as_deref()
            .is_none_or(|o| "dynamo".starts_with(o) || o.starts_with("dynamo") || o == "crtc");
    if want_crtc {
        let bpe = crtc::memory(&w);
        eprintln!("{}: {bpe:.1} bytes per entry", crtc::CRTC);
        rows.push(Row {
            name: crtc::CRTC,
            mode: "1 thread",
            note: "n/a: events apply only through SyncIndexer::worker (a channel-draining loop), so lookups cannot be interleaved in stream order on one thread".into(),
            ..Row::default()
        });
        let mut runs = Vec::new();
        for _ in 0..args.repeat {
            let o = crtc::run(&w, RECENT, hist);
            runs.push(Row {
                name: crtc::CRTC,
                mode: "1 writer + 1 reader",
                events_per_s: w.block_events as f64 / o.elapsed.as_secs_f64(),
                mismatches: Some(o.final_mismatches),
                hist: Some(o.hist),
                ..Row::default()
            });
        }
        let mut r = combine(runs);
        r.bytes_per_entry = Some(bpe);
        eprintln!(
            "{} threaded: writer {} events/s, reader p50 {} p99 {} ns",
            crtc::CRTC,
            fmt_rate(r.events_per_s),
            r.p50,
            r.p99
        );
        rows.push(r);
    }
    print_table(&rows);
    print_default_ratios(&rows);
    let digest = peers::DEFAULT_ANSWERS.load(std::sync::atomic::Ordering::Relaxed);
    if digest != 0 {
        println!("default path answers digest: {digest:016x}");
    }
}

/// The default path against the contract lookup and kv-index, per mode:
/// issue 36's targets (p50 and p99 <= 2x contract, <= 3x kv-index).
fn print_default_ratios(rows: &[Row]) {
    for d in rows.iter().filter(|r| r.name == peers::OURS_DEFAULT) {
        let vs = |name: &str| {
            rows.iter()
                .find(|r| r.name == name && r.mode == d.mode && r.lookups > 0)
                .map_or("-".to_string(), |r| {
                    format!(
                        "p50 {:.2}x, p99 {:.2}x",
                        d.p50 as f64 / r.p50 as f64,
                        d.p99 as f64 / r.p99 as f64
                    )
                })
        };
        println!(
            "\ndefault path ({}): vs contract lookup {}; vs kv-index {}",
            d.mode,
            vs(peers::OURS_CONTRACT),
            vs(peers::KVI)
        );
    }
}
