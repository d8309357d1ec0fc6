//! The default ranking at the cost of its matches (issue 36): a lookup
//! scores the replicas that match, plus those with queued work, exactly, and
//! takes the best of the rest ("cold" replicas) from a structure kept in the
//! order that decides among them.
//!
//! A cold replica (no match, no queued work) differs from another only by
//! its pressure, its KV room bucket and its name: its estimate is the
//! request's whole prefill (`work(prompt)`) plus its pressure cost. So the
//! live fleet of a (tenant, model, scope, TTL) is kept as a [`ColdSet`]:
//! members by id, grouped in classes of equal (pressure, room bucket) in
//! pressure order, each class's members sorted by name label. It is built
//! by one pass over the fleet (what the one-pass ranking does per lookup)
//! and reused until something it was built from changes: a member's
//! pressure, KV room or freshness in a stats write (a plain refresh changes
//! nothing, [`ColdSets::stats_matter`]), a scope's membership
//! ([`fleet_changed`]), the names' table, or the instant a member's stats
//! stop being fresh.
//!
//! A lookup then reads what changes between rebuilds from the load tracker
//! (`load.rs`), whose orders are kept on writes: the busy replicas (finish
//! time after now), the replicas over the bounded-load limit (highest count
//! first), and the fleet's sum of recent counts (kept per registered set,
//! exact in fixed point). Matched and busy replicas are estimated one by
//! one; every class is a count minus the members excluded from it (matched,
//! busy, over the bound); the tie among equal cold replicas is the k-th
//! eligible member of its class in name order, found by skipping the
//! excluded positions. The cost is O(matched + busy + over the bound +
//! classes skipped + log fleet), where the one-pass ranking's is O(fleet);
//! and O(matched) when an eligible match beats every cold class, since no
//! busy or cold member can then be best or tie (their estimates are at
//! least their class's), so neither list is walked.
//! Same answers: the property test in `routing_scan.rs` holds the pick, the
//! delivery and the scores to the straightforward scan's.

use crate::cold_sets::{Class, ColdSet, FLEET_CHANGES, MAX_SETS};
use crate::fleet::{Cand, Fleet};
use crate::index::Index;
use crate::lookup::Raw;
use crate::routing::{IdRoute, RouteParams, TENTATIVE_CREDIT, room_bucket};
use crate::sync::{read, write};
use crate::types::{LookupRequest, Tier};
use std::sync::Arc;
use std::sync::atomic::Ordering;

thread_local! {
    static GATHER: std::cell::RefCell<Fleet> = std::cell::RefCell::default();
    static BUFS: std::cell::RefCell<Bufs> = std::cell::RefCell::default();
}

/// Per-thread buffers of one lookup.
#[derive(Default)]
struct Bufs {
    /// By replica id: 1 + position in `e`; 0: not there.
    at: Vec<u32>,
    /// Matched, then busy replicas.
    e: Vec<Cand>,
    /// By replica id: its first tentative extension, tokens; 0: none
    /// (cleared after each lookup).
    ext: Vec<i32>,
    /// By rank: members in `e`; members over the bound (not in `e`).
    xe: Vec<u64>,
    xo: Vec<u64>,
    /// Ranks set in `xe`, `xo` (to clear them).
    set_ranks: Vec<u32>,
    /// Tied: (label, id, position in `e` or `u32::MAX`).
    tied: Vec<(u64, u32, u32)>,
    /// Positions in `e` of the eligible candidates at the best estimate.
    at_best: Vec<u32>,
    /// Tied classes: (class, eligible members).
    tied_classes: Vec<(u32, usize)>,
}

/// Bits set in `bits` at positions `lo..hi`.
fn count(bits: &[u64], lo: usize, hi: usize) -> usize {
    let mut n = 0;
    let mut i = lo;
    while i < hi {
        let (w, b) = (i / 64, i % 64);
        let take = (64 - b).min(hi - i);
        let mask = if take == 64 {
            u64::MAX
        } else {
            ((1u64 << take) - 1) << b
        };
        n += (bits[w] & mask).count_ones() as usize;
        i += take;
    }
    n
}

/// The position of the `j`-th (from 0) position in `lo..hi` set in
/// neither `a` nor, when given, `b`.
fn nth_clear(a: &[u64], b: Option<&[u64]>, lo: usize, hi: usize, mut j: usize) -> Option<usize> {
    let mut i = lo;
    while i < hi {
        let (w, bit) = (i / 64, i % 64);
        let take = (64 - bit).min(hi - i);
        let mask = if take == 64 {
            u64::MAX
        } else {
            ((1u64 << take) - 1) << bit
        };
        let mut free = !(a[w] | b.map_or(0, |b| b[w])) & mask;
        let n = free.count_ones() as usize;
        if j < n {
            for _ in 0..j {
                free &= free - 1;
            }
            return Some(w * 64 + free.trailing_zeros() as usize);
        }
        j -= n;
        i += take;
    }
    None
}

impl Index {
    /// The fleet set of (tm, scope, ttl) at `now`: the kept one while valid,
    /// else rebuilt.
    fn cold_set(&self, tm: u32, scope: Option<u32>, ttl: i64, now: i64) -> Arc<ColdSet> {
        let key = (tm, scope.unwrap_or(u32::MAX), ttl);
        let changes = FLEET_CHANGES.load(Ordering::Acquire);
        let epoch = self.store.table_epoch.load(Ordering::Acquire);
        let old_slot = {
            let m = read(&self.routing.cold.map);
            match m.get(&key) {
                Some(s) if s.valid(now, changes, epoch) => return s.clone(),
                Some(s) => Some(s.slot),
                None => None,
            }
        };
        let mut m = write(&self.routing.cold.map);
        let slot = match old_slot.or_else(|| m.get(&key).map(|s| s.slot)) {
            Some(s) => s,
            None => {
                if m.len() >= MAX_SETS {
                    m.clear();
                    self.routing.load.clear_groups();
                }
                m.values().map(|s| s.slot + 1).max().unwrap_or(0)
            }
        };
        // Before the build reads the stats: a stats writer that reads the
        // old bound wrote before the build read (`ColdSets::stats_matter`).
        self.routing.cold.min_ttl.fetch_min(ttl, Ordering::SeqCst);
        let set = Arc::new(self.build_cold_set(tm, scope, ttl, now, changes, epoch, slot));
        self.routing.load.register_group(slot, set.members.clone());
        m.insert(key, set.clone());
        set
    }

    #[allow(clippy::too_many_arguments)]
    fn build_cold_set(
        &self,
        tm: u32,
        scope: Option<u32>,
        ttl: i64,
        now: i64,
        changes: u64,
        epoch: u64,
        slot: usize,
    ) -> ColdSet {
        let mut valid_until = i64::MAX;
        let mut list: Vec<(u32, f32, f32)> = Vec::new();
        crate::scratch::with(&GATHER, |f: &mut Fleet| {
            // As the one-pass ranking gathers it: fresh stats ∪ scope.
            self.gather_live(f, tm, scope, now, ttl, |s, fresh_stats| {
                valid_until = valid_until.min(s.last_seen.saturating_add(ttl));
                if fresh_stats {
                    valid_until = valid_until.min(s.stats_reported.saturating_add(ttl));
                }
            });
            f.take(|r, pressure, usage, _, _| list.push((r, pressure, usage)));
        });
        let top = list.last().map_or(0, |x| x.0 as usize + 1);
        let mut set = ColdSet {
            built_ns: now,
            valid_until,
            changes,
            names_epoch: epoch,
            slot,
            n: list.len(),
            members: vec![0; top.div_ceil(64)],
            pressure: vec![0.0; top],
            usage: vec![f32::NAN; top],
            rank_of: vec![0; top],
            classes: Vec::new(),
            exotic: list.iter().any(|x| x.1.is_nan()),
        };
        let catalog = read(&self.store.catalog);
        let mut order: Vec<(f32, i32, u64, u32)> = list
            .iter()
            .map(|&(r, p, u)| {
                set.members[r as usize / 64] |= 1 << (r % 64);
                set.pressure[r as usize] = p;
                set.usage[r as usize] = u;
                (
                    p,
                    room_bucket(u).unwrap_or(i32::MAX),
                    catalog.replica_label(r),
                    r,
                )
            })
            .collect();
        drop(catalog);
        order.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then((a.2, a.3).cmp(&(b.2, b.3)))
        });
        for (rank, (p, room, label, r)) in order.into_iter().enumerate() {
            let room = (room != i32::MAX).then_some(room);
            let same = set
                .classes
                .last()
                .is_some_and(|c| c.pressure.total_cmp(&p).is_eq() && c.room == room);
            if !same {
                set.classes.push(Class {
                    pressure: p,
                    room,
                    start: rank,
                    members: Vec::new(),
                });
            }
            let ci = set.classes.len() - 1;
            set.classes[ci].members.push((label, r));
            set.rank_of[r as usize] = rank as u32;
        }
        set
    }

    /// The default ranking's pick through the fleet set (module docs):
    /// `false` when the set cannot answer (the caller runs the one-pass
    /// ranking instead).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn route_cold<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        chain: bool,
        part: Option<u32>,
        (tm, scope, ttl, now): (u32, Option<u32>, i64, i64),
        raws: &[Raw],
        tentative: &[(u32, i32)],
        prompt: f64,
        out: &mut IdRoute,
    ) -> bool {
        let set = self.cold_set(tm, scope, ttl, now);
        if set.exotic {
            return false;
        }
        if set.n == 0 && raws.is_empty() && tentative.is_empty() {
            out.result.strategy = self.classify_miss(req.tenant, req.model, req.hash_scheme);
            return true;
        }
        crate::scratch::with(&BUFS, |b: &mut Bufs| {
            self.pick_cold(
                req, p, chain, part, &set, now, raws, tentative, prompt, b, out,
            );
            // Clear the marks for the next lookup.
            for c in &b.e {
                b.at[c.replica as usize] = 0;
            }
            for &x in &b.set_ranks {
                b.xe[x as usize / 64] = 0;
                b.xo[x as usize / 64] = 0;
            }
            b.set_ranks.clear();
        });
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn pick_cold<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        chain: bool,
        part: Option<u32>,
        set: &ColdSet,
        now: i64,
        raws: &[Raw],
        tentative: &[(u32, i32)],
        prompt: f64,
        b: &mut Bufs,
        out: &mut IdRoute,
    ) {
        let w = &p.weights;
        // Lock order: the catalog, then the load (the sweep's release holds
        // the catalog's write lock while it forgets a queue).
        let catalog = read(&self.store.catalog);
        let load = self.routing.load.view(now);
        b.e.clear();
        let blank = |r: u32, raw: Option<usize>| Cand {
            replica: r,
            raw,
            tentative_tokens: 0,
            matched: 0,
            queued: 0.0,
            recent: 0.0,
            recent_raw: 0,
            pressure: 0.0,
            usage: f32::NAN,
            work: 0.0,
            est: 0.0,
        };
        // The explicit candidates: matched (first run per replica wins, then
        // the first tentative extension), then busy members.
        let mark = |at: &mut Vec<u32>, r: u32, i: usize| {
            let r = r as usize;
            if at.len() <= r {
                at.resize((r + 1).next_power_of_two(), 0);
            }
            at[r] = i as u32 + 1;
        };
        let pos = |at: &[u32], r: u32| at.get(r as usize).copied().unwrap_or(0);
        let pw = w.pressure_us.max(0.0);
        let mut n = set.n;
        let mut sum = load.group_sum(set.slot);
        let words = set.n.div_ceil(64);
        if b.xe.len() < words {
            b.xe.resize(words, 0);
            b.xo.resize(words, 0);
        }
        // Their estimates, as the one-pass ranking computes them.
        let estimate = |c: &mut Cand,
                        matched: bool,
                        xe: &mut [u64],
                        set_ranks: &mut Vec<u32>,
                        n: &mut usize,
                        sum: &mut u128| {
            let r = c.replica;
            if set.has(r) {
                let pm = set.pressure[r as usize];
                c.pressure = if matched && 0.0f32.total_cmp(&pm).is_gt() {
                    0.0
                } else {
                    pm
                };
                c.usage = set.usage[r as usize];
                let x = set.rank_of[r as usize];
                xe[x as usize / 64] |= 1 << (x % 64);
                set_ranks.push(x);
            } else {
                *n += 1;
                *sum += u128::from(load.raw_recent(r));
            }
            let (real, fresh, tier) = c.raw.map_or((0, 1.0, Tier::T1), |i| {
                (raws[i].tokens.max(0), raws[i].fresh, raws[i].tier)
            });
            let ext = c.tentative_tokens;
            c.matched = real.saturating_add(ext);
            let credited = f64::from(real) * w.credit(tier) * f64::from(fresh)
                + f64::from(ext) * TENTATIVE_CREDIT;
            c.work = w.work_us(prompt - credited);
            c.queued = load.queued_us(r);
            c.recent_raw = load.raw_recent(r);
            c.recent = load.recent_of(c.recent_raw);
            c.est = c.queued + c.work + pw * f64::from(c.pressure.max(0.0));
        };
        // Each match is estimated once, as it is met: the tentative
        // extensions by replica first (the first one per replica counts).
        for &(r, tokens) in tentative {
            let r = r as usize;
            if b.ext.len() <= r {
                b.ext.resize((r + 1).next_power_of_two(), 0);
            }
            if b.ext[r] == 0 {
                b.ext[r] = tokens;
            }
        }
        let ext_of = |ext: &[i32], r: u32| ext.get(r as usize).copied().unwrap_or(0);
        // Room for every match up front: the pushes below never grow.
        b.e.reserve(raws.len() + tentative.len());
        if let Some(top) = raws.iter().map(|x| x.replica).max() {
            if b.at.len() <= top as usize {
                b.at.resize((top as usize + 1).next_power_of_two(), 0);
            }
        }
        // A match that is a member of the fleet set (nearly all): its
        // candidate computed whole and written once.
        let tier_credit = [w.credit(Tier::T1), w.credit(Tier::T2), w.credit(Tier::T3)];
        let credit_of = |t: Tier| match t {
            Tier::T1 => tier_credit[0],
            Tier::T2 => tier_credit[1],
            Tier::T3 => tier_credit[2],
            _ => 0.0,
        };
        for (i, x) in raws.iter().enumerate() {
            let r = x.replica;
            if pos(&b.at, r) != 0 {
                continue;
            }
            mark(&mut b.at, r, b.e.len());
            let ext = ext_of(&b.ext, r);
            if !set.has(r) {
                b.e.push(blank(r, Some(i)));
                if let Some(c) = b.e.last_mut() {
                    c.tentative_tokens = ext;
                    estimate(c, true, &mut b.xe, &mut b.set_ranks, &mut n, &mut sum);
                }
                continue;
            }
            let ri = r as usize;
            let pm = set.pressure[ri];
            let pressure = if 0.0f32.total_cmp(&pm).is_gt() {
                0.0
            } else {
                pm
            };
            let rank = set.rank_of[ri];
            b.xe[rank as usize / 64] |= 1 << (rank % 64);
            b.set_ranks.push(rank);
            let real = x.tokens.max(0);
            let credited = f64::from(real) * credit_of(x.tier) * f64::from(x.fresh)
                + f64::from(ext) * TENTATIVE_CREDIT;
            let work = w.work_us(prompt - credited);
            let queued = load.queued_us(r);
            let recent_raw = load.raw_recent(r);
            b.e.push(Cand {
                replica: r,
                raw: Some(i),
                tentative_tokens: ext,
                matched: real.saturating_add(ext),
                queued,
                recent: load.recent_of(recent_raw),
                recent_raw,
                pressure,
                usage: set.usage[ri],
                work,
                est: queued + work + pw * f64::from(pressure.max(0.0)),
            });
        }
        for &(r, tokens) in tentative {
            if pos(&b.at, r) == 0 {
                mark(&mut b.at, r, b.e.len());
                b.e.push(blank(r, None));
                if let Some(c) = b.e.last_mut() {
                    c.tentative_tokens = tokens;
                    estimate(c, true, &mut b.xe, &mut b.set_ranks, &mut n, &mut sum);
                }
            }
            if let Some(x) = b.ext.get_mut(r as usize) {
                *x = 0;
            }
        }
        let floor = p.min_matched_tokens.max(1);
        let is_match = |c: &Cand| c.matched >= floor;
        let maxp = w.affinity_max_pressure;
        let pressure_ok = |c: &Cand| is_match(c) || c.pressure < maxp;
        // The bounded-load limit: busy members do not move it (the sum
        // over the set counts every member).
        let bound = w.load_bound;
        let limit = if bound.is_nan() || bound <= 0.0 {
            f64::INFINITY
        } else {
            bound * load.mean_recent(sum, n) + 1.0
        };
        let cold_work = w.work_us(prompt);
        let class_est = |c: &Class| 0.0 + cold_work + pw * f64::from(c.pressure.max(0.0));
        // When a match is eligible and beats every cold class, no busy or
        // cold member can be best or tie (each estimates at least its
        // class's cold estimate, the first class's the least): the busy
        // and over-bound members are then not enumerated. The rules below
        // answer as if they were (a match makes `any_ok`, an eligible one
        // `under_any`, and no class enters the tie).
        let under = |c: &Cand| !limit.is_finite() || c.recent <= limit;
        // One pass: whether any candidate matches, the best eligible
        // estimate and the candidates at it (what the tie needs when a
        // match wins).
        let mut any_match = false;
        let mut best = f64::INFINITY;
        b.at_best.clear();
        for (i, c) in b.e.iter().enumerate() {
            any_match |= is_match(c);
            if pressure_ok(c) && under(c) {
                if c.est < best {
                    best = c.est;
                    b.at_best.clear();
                    b.at_best.push(i as u32);
                } else if c.est == best {
                    b.at_best.push(i as u32);
                }
            }
        }
        let matches_win = if any_match {
            let wins = best.is_finite()
                && set
                    .classes
                    .first()
                    // Not under the maximum (NaN included): not ok.
                    .is_none_or(|c| {
                        c.pressure.partial_cmp(&maxp).is_none_or(|o| o.is_ge())
                            || class_est(c) > best
                    });
            wins.then_some(best)
        } else {
            None
        };
        if matches_win.is_none() {
            for r in load.busy() {
                if set.has(r) && pos(&b.at, r) == 0 {
                    mark(&mut b.at, r, b.e.len());
                    b.e.push(blank(r, None));
                    if let Some(c) = b.e.last_mut() {
                        estimate(c, false, &mut b.xe, &mut b.set_ranks, &mut n, &mut sum);
                    }
                }
            }
        }
        let classes = &set.classes;
        let ex = |xs: &[u64], c: usize| {
            let (lo, hi) = classes[c].ranks();
            count(xs, lo, hi)
        };
        b.tied.clear();
        b.tied_classes.clear();
        let under_any = if let Some(best) = matches_win {
            // The eligible matches at the best estimate (what the rules
            // below give when a match wins: every rule's "unless it leaves
            // nobody" is false, no class ties).
            debug_assert!(b.at_best.iter().all(|&i| b.e[i as usize].est <= best));
            for &i in &b.at_best {
                let r = b.e[i as usize].replica;
                b.tied.push((catalog.replica_label(r), r, i));
            }
            false
        } else {
            // Busy replicas without a match are skipped, unless that leaves
            // nobody. Classes are in pressure order: the ones under the maximum
            // come first.
            let any_ok = b.e.iter().any(pressure_ok)
                || classes
                    .iter()
                    .enumerate()
                    .take_while(|(_, c)| c.pressure < maxp)
                    .any(|(i, c)| c.members.len() > ex(&b.xe, i));
            let ok = |c: &Cand| !any_ok || pressure_ok(c);
            let ok_class = |c: &Class| !any_ok || c.pressure < maxp;
            // The bounded-load rule, unless it leaves nobody.
            if limit.is_finite() {
                for r in load.over(limit) {
                    if set.has(r) && pos(&b.at, r) == 0 {
                        let x = set.rank_of[r as usize];
                        b.xo[x as usize / 64] |= 1 << (x % 64);
                        b.set_ranks.push(x);
                    }
                }
            }
            let under_any = limit.is_finite()
                && (b.e.iter().any(|c| ok(c) && c.recent <= limit)
                    || classes
                        .iter()
                        .enumerate()
                        .take_while(|(_, c)| ok_class(c))
                        .any(|(i, c)| c.members.len() > ex(&b.xe, i) + ex(&b.xo, i)));
            let eligible = |c: &Cand| ok(c) && (!under_any || c.recent <= limit);
            let elig = |i: usize| {
                let c = &classes[i];
                if !ok_class(c) {
                    return 0;
                }
                let out = if under_any { ex(&b.xo, i) } else { 0 };
                c.members.len() - ex(&b.xe, i) - out
            };
            let first = (0..classes.len())
                .take_while(|&i| ok_class(&classes[i]))
                .find(|&i| elig(i) > 0);
            let best =
                b.e.iter()
                    .filter(|c| eligible(c))
                    .map(|c| c.est)
                    .fold(f64::INFINITY, f64::min)
                    .min(first.map_or(f64::INFINITY, |i| class_est(&classes[i])));
            for (i, c) in b.e.iter().enumerate() {
                if eligible(c) && c.est <= best {
                    b.tied
                        .push((catalog.replica_label(c.replica), c.replica, i as u32));
                }
            }
            if let Some(f) = first {
                for (i, c) in classes.iter().enumerate().skip(f) {
                    if !ok_class(c) || class_est(c) > best {
                        break;
                    }
                    if elig(i) > 0 {
                        b.tied_classes.push((i as u32, elig(i)));
                    }
                }
            }
            under_any
        };
        // Among equals a new prefix goes where there is room.
        let room = b
            .tied
            .iter()
            .filter_map(|t| room_bucket(b.e[t.2 as usize].usage))
            .chain(
                b.tied_classes
                    .iter()
                    .filter_map(|&(i, _)| classes[i as usize].room),
            )
            .min();
        if let Some(room) = room {
            let e = &b.e;
            b.tied
                .retain(|t| room_bucket(e[t.2 as usize].usage) == Some(room));
            b.tied_classes
                .retain(|&(i, _)| classes[i as usize].room == Some(room));
        }
        let in_classes: usize = b.tied_classes.iter().map(|&(_, n)| n).sum();
        let total = b.tied.len() + in_classes;
        if total == 0 {
            return;
        }
        // (The seed's hash decides nothing among one.)
        let k = if p.seed.is_empty() || total == 1 {
            0
        } else {
            crate::affinity::tie_index(p.seed, total)
        };
        let xo = under_any.then_some(b.xo.as_slice());
        let picked: (u32, Option<usize>) = match b.tied_classes.as_slice() {
            [] => {
                let t = *b.tied.select_nth_unstable_by_key(k, |t| (t.0, t.1)).1;
                (t.1, Some(t.2 as usize))
            }
            &[(ci, _)] => {
                // The k-th of the class's eligible members merged with the
                // tied explicit ones, by (label, id).
                let class = &classes[ci as usize];
                let (lo, hi) = class.ranks();
                let nth = |j: usize| {
                    nth_clear(&b.xe, xo, lo, hi, j).map_or(u32::MAX, |x| class.members[x - lo].1)
                };
                let before = |key: (u64, u32)| {
                    let pp = class.members.partition_point(|m| *m < key);
                    pp - count(&b.xe, lo, lo + pp) - xo.map_or(0, |o| count(o, lo, lo + pp))
                };
                b.tied.sort_unstable_by_key(|t| (t.0, t.1));
                let mut found = None;
                for (taken, t) in b.tied.iter().enumerate() {
                    let cb = before((t.0, t.1));
                    if cb + taken > k {
                        found = Some((nth(k - taken), None));
                        break;
                    }
                    if cb + taken == k {
                        found = Some((t.1, Some(t.2 as usize)));
                        break;
                    }
                }
                found.unwrap_or_else(|| (nth(k - b.tied.len()), None))
            }
            several => {
                // Rare (equal estimates at different pressures): every
                // eligible member of the tied classes, then a selection.
                let mut all: Vec<(u64, u32, u32)> = b.tied.clone();
                for &(ci, _) in several {
                    let class = &classes[ci as usize];
                    let (lo, _) = class.ranks();
                    for (j, m) in class.members.iter().enumerate() {
                        let x = lo + j;
                        let bit = 1u64 << (x % 64);
                        let out =
                            b.xe[x / 64] & bit != 0 || xo.is_some_and(|o| o[x / 64] & bit != 0);
                        if !out {
                            all.push((m.0, m.1, u32::MAX));
                        }
                    }
                }
                let t = *all.select_nth_unstable_by_key(k, |t| (t.0, t.1)).1;
                (t.1, (t.2 != u32::MAX).then_some(t.2 as usize))
            }
        };
        if picked.0 == u32::MAX {
            // Unreachable: k < the eligible count.
            debug_assert!(false, "no k-th eligible member");
            return;
        }
        let pick = match picked {
            (_, Some(i)) => i,
            (r, None) => {
                let mut c = blank(r, None);
                c.pressure = set.pressure[r as usize];
                c.usage = set.usage[r as usize];
                c.work = cold_work;
                c.queued = load.queued_us(r);
                c.recent_raw = load.raw_recent(r);
                c.recent = load.recent_of(c.recent_raw);
                c.est = c.queued + c.work + pw * f64::from(c.pressure.max(0.0));
                mark(&mut b.at, r, b.e.len());
                b.e.push(c);
                b.e.len() - 1
            }
        };
        drop(load);
        self.answer(req, p, chain, part, raws, &b.e, pick, false, &catalog, out);
    }
}
