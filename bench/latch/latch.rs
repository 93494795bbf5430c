//! Microbenchmarks of the latch core (pure Rust, process-local locks):
//! acquire+release and validation at 1k, 10k and 60k live latches, on one
//! thread and on two.  Goals: acquire+release <= 250 ns and validate <=
//! 200 ns at 10k live latches, no allocation on these paths.
//!
//!     cargo bench --features std-locks --bench latch
//!
//! A counting global allocator reports allocations per operation.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use pgkvx_latch::locks::heap_table;
use pgkvx_latch::locks::std_locks::StdLocks;
use pgkvx_latch::rng::XorShift64 as Rng;
use pgkvx_latch::{Config, Holder, LatchTable, ReadSnapshot, RelId, Span, TxEnd, Xid};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
// SAFETY: forwards to the system allocator, counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(p, l) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

const REL: RelId = RelId(0x0000_0001_0000_6000);

fn key(k: u64) -> [u8; 8] {
    (k ^ (1 << 63)).to_be_bytes()
}

type Table = &'static LatchTable<'static, StdLocks>;

/// A table holding `live` point latches on random keys from 64 holders,
/// `split` called after the `i`-th.
fn filled(live: u32, mut split: impl FnMut(Table, u32)) -> Table {
    let t = heap_table(Config { max_entries: 80_000, max_ranges: 1024, max_tables: 8, max_backends: 72 });
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    for i in 0..live {
        let slot = i % 64;
        let h = Holder { xid: Xid(1000 + slot), pid: slot as i32, now_us: 0, owner: 0, role: 0 };
        t.writer().acquire(slot, REL, &Span::point(&key(r.next())), &h).unwrap();
        split(t, i);
    }
    t
}

/// `live` latches split as finely as one table can be
/// (`MAX_RANGES_PER_TABLE` = 128 ranges: ~78 latches each at 10k) — where
/// contention-driven splitting takes a busy table.
fn populated(live: u32) -> Table {
    let t = filled(live, |t, i| {
        if i % 512 == 511 {
            for range in t.maintainer().ranges_of(REL) {
                while t.maintainer().split(70, range).is_some() && t.maintainer().ranges_of(REL).len() < 1000 {}
            }
        }
    });
    loop {
        let before = t.maintainer().ranges_of(REL).len();
        for range in t.maintainer().ranges_of(REL) {
            t.maintainer().split(70, range);
        }
        if t.maintainer().ranges_of(REL).len() == before || before * 1024 > live as usize * 2 {
            break;
        }
    }
    t
}

/// The same latches split only as far as the default
/// `pgkvx.range_max_latches` (1024) makes the maintenance workers split:
/// ranges of 512–1024, so each tree is a few levels deeper.
fn populated_default_ranges(live: u32) -> Table {
    filled(live, |t, _| {
        for range in t.maintainer().ranges_of(REL) {
            if t.maintainer().load(range) > 1024 {
                t.maintainer().split(70, range);
            }
        }
    })
}

fn acquire_release(t: &LatchTable<'_, StdLocks>, slot: u32, r: &mut Rng, xid: u32, commit: bool) {
    let h = Holder { xid: Xid(xid), pid: 1, now_us: 0, owner: 0, role: 0 };
    t.writer().acquire(slot, REL, &Span::point(&key(r.next())), &h).unwrap();
    t.writer().release_all(slot, if commit { TxEnd::Committed } else { TxEnd::Aborted });
}

fn validate(t: &LatchTable<'_, StdLocks>, r: &mut Rng, xip: &[Xid]) -> bool {
    let snap = ReadSnapshot { xmin: Xid(900), xmax: Xid(2000), xip, after: Xid(2000), own: Xid::INVALID };
    let k = r.next();
    let span = Span { start: Span::point(&key(k)).start, end: Span::point(&key(k.wrapping_add(1 << 40))).end };
    t.reader()
        .check(REL, &span, &snap, &|_| true, &mut |c| {
            black_box(c);
        })
        .clean()
}

fn per_op(label: &str, ops: u64, f: impl FnOnce()) {
    let before = ALLOCS.load(Relaxed);
    f();
    let n = ALLOCS.load(Relaxed) - before;
    println!("{label}: {:.3} allocations per operation", n as f64 / ops as f64);
}

fn bench(c: &mut Criterion) {
    let xip: Vec<Xid> = (1000..1010).map(Xid).collect();
    for live in [1_000u32, 10_000, 60_000] {
        let t = populated(live);
        let mut g = c.benchmark_group(format!("latch/{live}_live"));
        g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
        let mut r = Rng(42);
        g.bench_function(BenchmarkId::new("acquire_release", "abort"), |b| {
            b.iter(|| acquire_release(t, 65, &mut r, 1500, false))
        });
        // Commit leaves a tombstone; with the horizon past it, writers
        // reclaim tombstones as they go, so the table stays at `live`.
        t.maintainer().set_horizon(Xid(1600));
        g.bench_function(BenchmarkId::new("acquire_release", "commit"), |b| {
            b.iter(|| acquire_release(t, 65, &mut r, 1500, true))
        });
        g.bench_function(BenchmarkId::new("validate", "1 thread"), |b| b.iter(|| validate(t, &mut r, &xip)));
        // Two threads at once: each measures its own operations.
        for (name, op) in [("acquire_release", 0), ("validate", 1)] {
            g.bench_function(BenchmarkId::new(name, "2 threads"), |b| {
                b.iter_custom(|iters| {
                    let run = move |slot: u32, seed: u64| {
                        let mut r = Rng(seed);
                        let xip: Vec<Xid> = (1000..1010).map(Xid).collect();
                        let start = Instant::now();
                        for _ in 0..iters {
                            if op == 0 {
                                acquire_release(t, slot, &mut r, 1500 + slot, true);
                            } else {
                                black_box(validate(t, &mut r, &xip));
                            }
                        }
                        start.elapsed()
                    };
                    let other = std::thread::spawn(move || run(66, 7));
                    let mine = run(67, 11);
                    mine.max(other.join().unwrap())
                })
            });
        }
        if live == 10_000 {
            let d = populated_default_ranges(live);
            println!("default-sized ranges at 10k: {}", d.maintainer().ranges_of(REL).len());
            g.bench_function(BenchmarkId::new("acquire_release", "abort, ranges <= 1024"), |b| {
                b.iter(|| acquire_release(d, 65, &mut r, 1500, false))
            });
        }
        g.finish();
        if live == 10_000 {
            per_op("acquire+release (abort) at 10k", 100_000, || {
                for _ in 0..100_000 {
                    acquire_release(t, 65, &mut r, 1500, false)
                }
            });
            per_op("acquire+release (commit) at 10k", 100_000, || {
                for _ in 0..100_000 {
                    acquire_release(t, 65, &mut r, 1500, true)
                }
            });
            per_op("validate at 10k", 100_000, || {
                for _ in 0..100_000 {
                    black_box(validate(t, &mut r, &xip));
                }
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
