//! The interval index of one latch range: a treap ordered by (start, node id)
//! and augmented with the node of greatest end in each subtree, so an overlap
//! query visits O(log n + matches) nodes.
//!
//! Nodes are entry indices (u32) into the fixed entry arena; the tree stores
//! only links, so it needs no allocation and lives in shared memory as is.
//! Callers hold the range's lock (exclusive to modify, shared to query).

use super::span::{KeyBuf, Span};
use std::cmp::Ordering;

/// The empty link.
pub const NIL: u32 = u32::MAX;

/// Node storage the treap manipulates.  Keys (`start`, `end`) must not change
/// while a node is in a tree.
pub trait NodeStore {
    fn left(&self, n: u32) -> u32;
    fn right(&self, n: u32) -> u32;
    fn set_left(&self, n: u32, v: u32);
    fn set_right(&self, n: u32, v: u32);
    /// `right(n)` if `go_right`, else `left(n)`.  Stores that keep the two
    /// links in an array index it, so a descent's direction (a coin toss
    /// for random keys) is data, not a branch the CPU mispredicts half the
    /// time.
    #[inline(always)]
    fn child(&self, n: u32, go_right: bool) -> u32 {
        if go_right {
            self.right(n)
        } else {
            self.left(n)
        }
    }
    /// The node of greatest `end` in `n`'s subtree.
    fn max_end(&self, n: u32) -> u32;
    /// `end(max_end(n)).head()`, kept beside `n`'s links so that most
    /// comparisons with the subtree's greatest end stay in `n`'s cache line.
    fn max_end_head(&self, n: u32) -> u64;
    /// Sets `max_end(n) = v`; `head` is `end(v).head()`.
    fn set_max_end(&self, n: u32, v: u32, head: u64);
    fn prio(&self, n: u32) -> u32;
    /// `start(n).head()`, beside the links for the same reason.
    fn start_head(&self, n: u32) -> u64;
    /// Hints that `n`'s node will be read soon (NIL allowed).  A descent
    /// hints both children before deciding between them, so the next
    /// level's cache miss overlaps this level's comparison.
    #[inline(always)]
    fn prefetch(&self, _n: u32) {}
    /// `end(n).head()`; stores may keep it beside the links too.
    #[inline(always)]
    fn end_head(&self, n: u32) -> u64 {
        self.end(n).head()
    }
    fn start(&self, n: u32) -> &KeyBuf;
    fn end(&self, n: u32) -> &KeyBuf;
}

#[inline(always)]
fn less<S: NodeStore + ?Sized>(s: &S, a: u32, b: u32) -> bool {
    let (x, y) = (s.start_head(a), s.start_head(b));
    if x != y {
        return x < y;
    }
    less_tied(s, a, b)
}

/// [`less`] when the leading words tie: rare for most keys, so kept out of
/// line to leave the descent loops branch-free.
#[cold]
#[inline(never)]
fn less_tied<S: NodeStore + ?Sized>(s: &S, a: u32, b: u32) -> bool {
    match s.start(a).cmp(s.start(b)) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => a < b,
    }
}

/// `k` against the greatest end in `n`'s subtree; visits the node holding
/// that end only when the cached leading words tie.
#[inline(always)]
fn cmp_max_end<S: NodeStore + ?Sized>(s: &S, n: u32, k: &KeyBuf) -> Ordering {
    match k.head().cmp(&s.max_end_head(n)) {
        Ordering::Equal => k.cmp(s.end(s.max_end(n))),
        o => o,
    }
}

/// `k` against `n`'s start, by the cached leading word first.
#[inline(always)]
fn cmp_start<S: NodeStore + ?Sized>(s: &S, n: u32, k: &KeyBuf) -> Ordering {
    match k.head().cmp(&s.start_head(n)) {
        Ordering::Equal => k.cmp(s.start(n)),
        o => o,
    }
}

/// Whether `m` should stand for a subtree's greatest end instead of `best`:
/// the greater end, and among equal ends the lower node id.  Making the
/// choice canonical means it depends only on which nodes a subtree holds,
/// not on the order of rotations that built it, so a node's `max_end` is
/// always its own id or one of its children's `max_end` — which lets
/// [`remove`] stop at the first ancestor that did not pick the removed node.
#[inline(always)]
fn beats<S: NodeStore + ?Sized>(s: &S, m: u32, best: u32) -> bool {
    match s.end(m).cmp(s.end(best)) {
        Ordering::Greater => true,
        Ordering::Equal => m < best,
        Ordering::Less => false,
    }
}

/// Whether inserting `n` (end `end`) below `cur` makes `n` `cur`'s
/// greatest end.
#[inline(always)]
fn raises_max<S: NodeStore + ?Sized>(s: &S, cur: u32, n: u32, end: &KeyBuf) -> bool {
    match cmp_max_end(s, cur, end) {
        Ordering::Greater => true,
        Ordering::Equal => n < s.max_end(cur),
        Ordering::Less => false,
    }
}

fn fix<S: NodeStore + ?Sized>(s: &S, n: u32) {
    let mut best = n;
    let mut head = s.end_head(n);
    for c in [s.left(n), s.right(n)] {
        if c != NIL {
            let (m, h) = (s.max_end(c), s.max_end_head(c));
            if h > head || (h == head && beats(s, m, best)) {
                best = m;
                head = h;
            }
        }
    }
    s.set_max_end(n, best, head);
}

fn rotate_right<S: NodeStore + ?Sized>(s: &S, y: u32) -> u32 {
    let x = s.left(y);
    s.set_left(y, s.right(x));
    s.set_right(x, y);
    fix(s, y);
    fix(s, x);
    x
}

fn rotate_left<S: NodeStore + ?Sized>(s: &S, x: u32) -> u32 {
    let y = s.right(x);
    s.set_right(x, s.left(y));
    s.set_left(y, x);
    fix(s, x);
    fix(s, y);
    y
}

/// Longest root-to-node path the iterative operations track; a treap of a
/// range's few thousand latches is far shallower (deeper paths fall back to
/// recursion).
const MAX_PATH: usize = 48;

/// Inserts node `n` (its links are overwritten) and returns the new root.
///
/// Iterative: descend to a leaf position updating each ancestor's greatest
/// end on the way (n can only raise it), then rotate n up while its
/// priority beats its parent's.
pub fn insert<S: NodeStore + ?Sized>(s: &S, root: u32, n: u32) -> u32 {
    let end = *s.end(n);
    s.set_left(n, NIL);
    s.set_right(n, NIL);
    s.set_max_end(n, n, end.head());
    if root == NIL {
        return n;
    }
    let mut path = [NIL; MAX_PATH];
    let mut depth = 0;
    let mut cur = root;
    loop {
        if depth == MAX_PATH {
            return insert_rec(s, root, n);
        }
        s.prefetch(s.left(cur));
        s.prefetch(s.right(cur));
        if raises_max(s, cur, n, &end) {
            s.set_max_end(cur, n, end.head());
        }
        path[depth] = cur;
        depth += 1;
        let go_right = !less(s, n, cur);
        let next = s.child(cur, go_right);
        if next == NIL {
            if go_right {
                s.set_right(cur, n);
            } else {
                s.set_left(cur, n);
            }
            break;
        }
        cur = next;
    }
    let mut root = root;
    while depth > 0 {
        let p = path[depth - 1];
        if s.prio(n) <= s.prio(p) {
            break;
        }
        if s.left(p) == n {
            rotate_right(s, p);
        } else {
            rotate_left(s, p);
        }
        depth -= 1;
        if depth == 0 {
            root = n;
        } else {
            let g = path[depth - 1];
            if s.left(g) == p {
                s.set_left(g, n);
            } else {
                s.set_right(g, n);
            }
        }
    }
    root
}

/// The recursive form of [`insert`], for paths deeper than its stack.
fn insert_rec<S: NodeStore + ?Sized>(s: &S, root: u32, n: u32) -> u32 {
    let end = *s.end(n);
    if root == NIL {
        s.set_left(n, NIL);
        s.set_right(n, NIL);
        s.set_max_end(n, n, end.head());
        return n;
    }
    // n joins root's subtree: only its end can raise the subtree's maximum,
    // so one comparison keeps the augmentation right on the way down;
    // rotations recompute the two nodes they move.
    if raises_max(s, root, n, &end) {
        s.set_max_end(root, n, end.head());
    }
    if less(s, n, root) {
        let l = insert_rec(s, s.left(root), n);
        s.set_left(root, l);
        if s.prio(l) > s.prio(root) {
            return rotate_right(s, root);
        }
    } else {
        let r = insert_rec(s, s.right(root), n);
        s.set_right(root, r);
        if s.prio(r) > s.prio(root) {
            return rotate_left(s, root);
        }
    }
    root
}

fn merge<S: NodeStore + ?Sized>(s: &S, a: u32, b: u32) -> u32 {
    if a == NIL {
        return b;
    }
    if b == NIL {
        return a;
    }
    if s.prio(a) > s.prio(b) {
        let r = merge(s, s.right(a), b);
        s.set_right(a, r);
        fix(s, a);
        a
    } else {
        let l = merge(s, a, s.left(b));
        s.set_left(b, l);
        fix(s, b);
        b
    }
}

/// Removes node `n`, which must be in the tree, and returns the new root.
///
/// Iterative: find n's parent, replace n by the merge of its children, then
/// recompute the greatest end of those ancestors whose greatest end was n
/// (no other ancestor lost a node).  Those ancestors are n's nearest ones:
/// a node's greatest end is its own or one of its children's, so an
/// ancestor holding n's end implies every node between them does too.
pub fn remove<S: NodeStore + ?Sized>(s: &S, root: u32, n: u32) -> u32 {
    let mut path = [NIL; MAX_PATH];
    let mut depth = 0;
    let mut cur = root;
    while cur != n {
        assert!(cur != NIL, "latch tree: node {n} not found");
        if depth == MAX_PATH {
            return remove_rec(s, root, n);
        }
        path[depth] = cur;
        depth += 1;
        s.prefetch(s.left(cur));
        s.prefetch(s.right(cur));
        cur = s.child(cur, !less(s, n, cur));
    }
    let sub = merge(s, s.left(n), s.right(n));
    if depth == 0 {
        return sub;
    }
    let p = path[depth - 1];
    if s.left(p) == n {
        s.set_left(p, sub);
    } else {
        s.set_right(p, sub);
    }
    for &a in path[..depth].iter().rev() {
        if s.max_end(a) != n {
            break;
        }
        fix(s, a);
    }
    root
}

/// The recursive form of [`remove`], for paths deeper than its stack.
fn remove_rec<S: NodeStore + ?Sized>(s: &S, root: u32, n: u32) -> u32 {
    assert!(root != NIL, "latch tree: node {n} not found");
    if root == n {
        return merge(s, s.left(n), s.right(n));
    }
    if less(s, n, root) {
        let l = remove_rec(s, s.left(root), n);
        s.set_left(root, l);
    } else {
        let r = remove_rec(s, s.right(root), n);
        s.set_right(root, r);
    }
    // Only an ancestor whose greatest end was n's can see its maximum drop;
    // the rest of the subtree kept its nodes.
    if s.max_end(root) == n {
        fix(s, root);
    }
    root
}

/// Calls `f` for every node overlapping `q`, in start order, until `f`
/// returns false.  Returns false when stopped early.
pub fn for_each_overlap<S: NodeStore + ?Sized>(s: &S, root: u32, q: &Span, f: &mut dyn FnMut(u32) -> bool) -> bool {
    if q.is_empty() {
        return true;
    }
    visit(s, root, q, f)
}

/// In-order overlap search.  Descents that can only continue one way loop
/// instead of recursing, so a query among point latches walks one path.
fn visit<S: NodeStore + ?Sized>(s: &S, mut n: u32, q: &Span, f: &mut dyn FnMut(u32) -> bool) -> bool {
    loop {
        if n == NIL || cmp_max_end(s, n, &q.start) != Ordering::Less {
            return true; // nothing below ends after the query starts
        }
        s.prefetch(s.left(n));
        s.prefetch(s.right(n));
        if cmp_start(s, n, &q.end) != Ordering::Greater {
            // n and its right subtree start at or after the query's end.
            n = s.left(n);
            continue;
        }
        let l = s.left(n);
        if l != NIL && cmp_max_end(s, l, &q.start) == Ordering::Less && !visit(s, l, q, f) {
            return false;
        }
        // A span starting at or after the query's start ends after it (spans
        // in the tree are not empty): only earlier starts need the end key.
        let overlaps = cmp_start(s, n, &q.start) != Ordering::Greater || *s.end(n) > q.start;
        if overlaps && !f(n) {
            return false;
        }
        n = s.right(n);
    }
}

/// Calls `f` for every node in start order.
pub fn for_each<S: NodeStore + ?Sized>(s: &S, root: u32, f: &mut dyn FnMut(u32)) {
    if root == NIL {
        return;
    }
    for_each(s, s.left(root), f);
    f(root);
    for_each(s, s.right(root), f);
}

/// Checks every invariant of the subtree at `n` (order, heap, canonical
/// greatest ends, cached heads) and returns its size.
#[cfg(test)]
pub(crate) fn check<S: NodeStore + ?Sized>(s: &S, n: u32) -> usize {
    if n == NIL {
        return 0;
    }
    let (l, r) = (s.left(n), s.right(n));
    // The canonical greatest end: greatest key, lowest id among ties.
    let mut best = *s.end(n);
    let mut best_id = n;
    for c in [l, r] {
        if c != NIL {
            assert!(s.prio(c) <= s.prio(n), "heap order");
            let m = s.max_end(c);
            if (*s.end(m), std::cmp::Reverse(m)) > (best, std::cmp::Reverse(best_id)) {
                (best, best_id) = (*s.end(m), m);
            }
        }
    }
    if l != NIL {
        assert!(less(s, l, n));
    }
    if r != NIL {
        assert!(less(s, n, r));
    }
    assert_eq!(s.max_end(n), best_id, "max_end augmentation (canonical node)");
    assert_eq!(s.max_end_head(n), best.head(), "cached head of the greatest end");
    assert_eq!(s.start_head(n), s.start(n).head(), "cached head of the start");
    assert_eq!(s.end_head(n), s.end(n).head(), "cached head of the end");
    1 + check(s, l) + check(s, r)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::RefCell;

    #[derive(Clone, Copy)]
    struct Node {
        l: u32,
        r: u32,
        m: u32,
        h: u64,
    }

    /// A Vec-backed store for exercising the treap alone; spans and
    /// priorities are fixed up front, links change.
    pub(crate) struct VecStore {
        links: RefCell<Vec<Node>>,
        spans: Vec<Span>,
        prios: Vec<u32>,
    }

    impl VecStore {
        fn new(spans: Vec<Span>, prios: Vec<u32>) -> Self {
            let links = RefCell::new(vec![Node { l: NIL, r: NIL, m: NIL, h: 0 }; spans.len()]);
            VecStore { links, spans, prios }
        }
    }

    impl NodeStore for VecStore {
        fn left(&self, n: u32) -> u32 {
            self.links.borrow()[n as usize].l
        }
        fn right(&self, n: u32) -> u32 {
            self.links.borrow()[n as usize].r
        }
        fn set_left(&self, n: u32, v: u32) {
            self.links.borrow_mut()[n as usize].l = v
        }
        fn set_right(&self, n: u32, v: u32) {
            self.links.borrow_mut()[n as usize].r = v
        }
        fn max_end(&self, n: u32) -> u32 {
            self.links.borrow()[n as usize].m
        }
        fn max_end_head(&self, n: u32) -> u64 {
            self.links.borrow()[n as usize].h
        }
        fn set_max_end(&self, n: u32, v: u32, head: u64) {
            let mut links = self.links.borrow_mut();
            links[n as usize].m = v;
            links[n as usize].h = head;
        }
        fn prio(&self, n: u32) -> u32 {
            self.prios[n as usize]
        }
        fn start_head(&self, n: u32) -> u64 {
            self.spans[n as usize].start.head()
        }
        fn start(&self, n: u32) -> &KeyBuf {
            &self.spans[n as usize].start
        }
        fn end(&self, n: u32) -> &KeyBuf {
            &self.spans[n as usize].end
        }
    }

    /// A two-byte key after `prefix` zero bytes: with a prefix of eight or
    /// more, every key has the same leading word and all comparisons go
    /// past the cached heads.
    fn key_after(prefix: usize, v: u16) -> Vec<u8> {
        let mut k = vec![0; prefix];
        k.extend_from_slice(&v.to_be_bytes());
        k
    }

    fn key(v: u16) -> Vec<u8> {
        key_after(0, v)
    }

    fn span(a: u16, b: u16) -> Span {
        Span::new(&key(a), Some(&key(b)))
    }

    fn check_invariants(s: &VecStore, n: u32) -> usize {
        check(s, n)
    }

    #[test]
    fn random_ops_match_naive_overlap() {
        // Heads decide every comparison / heads always tie / a mix.
        for prefix in [0, 8, 7] {
            random_ops_match_naive_overlap_with(prefix);
        }
    }

    fn random_ops_match_naive_overlap_with(prefix: usize) {
        let mut rng = crate::latch::rng::XorShift64(0x2545F4914F6CDD1D);
        let mut rnd = move || rng.next();
        let span = |a: u16, b: u16| Span::new(&key_after(prefix, a), Some(&key_after(prefix, b)));
        let (mut spans, mut prios) = (Vec::new(), Vec::new());
        for _ in 0..4000 {
            let a = (rnd() % 1000) as u16;
            spans.push(span(a, a + 1 + (rnd() % 40) as u16));
            prios.push(rnd() as u32);
        }
        let s = VecStore::new(spans, prios);
        let mut root = NIL;
        let mut live: Vec<u32> = Vec::new();
        let mut next = 0u32;
        for step in 0..4000 {
            if live.len() < 50 || rnd() % 3 != 0 {
                let n = next;
                next += 1;
                root = insert(&s, root, n);
                live.push(n);
            } else {
                let i = (rnd() as usize) % live.len();
                let n = live.swap_remove(i);
                root = remove(&s, root, n);
            }
            if step % 7 == 0 {
                assert_eq!(check_invariants(&s, root), live.len());
            }
            let qa = (rnd() % 1000) as u16;
            let q = span(qa, qa + (rnd() % 60) as u16);
            let mut got = Vec::new();
            for_each_overlap(&s, root, &q, &mut |n| {
                got.push(n);
                true
            });
            let mut want: Vec<u32> = live.iter().copied().filter(|&n| s.spans[n as usize].overlaps(&q)).collect();
            got.sort();
            want.sort();
            assert_eq!(got, want, "prefix {prefix} step {step} query {q:?}");
        }
    }

    #[test]
    fn early_stop_is_honoured() {
        let spans = (0..10u16).map(|i| span(i * 10, i * 10 + 5)).collect();
        let prios = (0..10u32).map(|i| i * 7919 % 101).collect();
        let s = VecStore::new(spans, prios);
        let mut root = NIL;
        for n in 0..10 {
            root = insert(&s, root, n);
        }
        let mut seen = 0;
        let done = for_each_overlap(&s, root, &span(0, 1000), &mut |_| {
            seen += 1;
            seen < 3
        });
        assert!(!done);
        assert_eq!(seen, 3);
    }
}
