//! The interval index of one latch range: a B+tree of entry ids ordered by
//! (start key, entry id).  Each slot of an inner node summarises its child
//! by the least start and the greatest end below it, so an overlap query
//! descends only into subtrees that can hold a match.
//!
//! Why a B-tree and not a binary tree: a latch is taken on a random key, so
//! every level of a descent is a cache miss.  A binary tree of a range's
//! thousand latches is ~20 levels deep; with 16 slots a node it is three,
//! and the root stays cached.  Every slot keeps the leading eight bytes of
//! its keys beside the links, which decide nearly every comparison, so a
//! descent reads the entries' full keys only on ties.
//!
//! Nodes come from a fixed pool ([`NodesMut::alloc_node`]); the tree needs
//! no allocation and lives in shared memory as is.  The tree code is safe
//! Rust over the [`Nodes`] and [`Keys`] it is handed: modifying takes
//! `&mut` nodes, which only a range's exclusive guard gives out (region/guard.rs).
//! Every node but the root is at least half full, which bounds the pool a
//! table of `n` entries in `r` ranges can need ([`pool_size`]).

use super::span::{KeyBuf, Span};
use std::cmp::Ordering;

/// The empty link.
pub const NIL: u32 = u32::MAX;

/// Slots a node holds between operations.
pub const FANOUT: usize = 16;
/// Slots every node but the root keeps.
const MIN: usize = FANOUT / 2;
/// One slot more than [`FANOUT`]: an insert lands first, then splits.
const CAP: usize = FANOUT + 1;
/// Deeper than any tree the pool can hold (8^12 entries).
const MAX_DEPTH: usize = 12;

/// Pool nodes a table of `entries` entries in `ranges` ranges can need.
/// Every node but a root holds at least `MIN` slots, so a tree of `n`
/// entries has at most n/8 non-root leaves, n/64 non-root nodes one level
/// up, and so on: fewer than n/7 in all, plus its root.  Summed over the
/// trees that is at most `entries / 7 + ranges`.  An insert splits only
/// when its new count needs the node, and split/merge move one entry at a
/// time (remove, then insert), so no moment needs more.
pub const fn pool_size(entries: u32, ranges: u32) -> u32 {
    entries / 7 + ranges
}

/// One B-tree node.  In a leaf, slot `i` is an entry: `start_ids[i]` =
/// `end_ids[i]` = the entry and the heads are its keys' leading words.  In
/// an inner node, slot `i` is child `kids[i]`, `start_ids[i]` is the entry
/// with the least (start, id) below it and `end_ids[i]` an entry with the
/// greatest end below it.  Fields in the order a descent reads them.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Node {
    pub len: u16,
    /// 0 for a leaf, else the height above the leaves.
    pub height: u16,
    pub start_heads: [u64; CAP],
    pub kids: [u32; CAP],
    pub end_heads: [u64; CAP],
    pub start_ids: [u32; CAP],
    pub end_ids: [u32; CAP],
}

const _: () = assert!(size_of::<Node>() == 512);

impl Node {
    pub const EMPTY: Node = Node {
        len: 0,
        height: 0,
        start_heads: [0; CAP],
        kids: [NIL; CAP],
        end_heads: [0; CAP],
        start_ids: [NIL; CAP],
        end_ids: [NIL; CAP],
    };

    fn len(&self) -> usize {
        self.len as usize
    }

    fn is_leaf(&self) -> bool {
        self.height == 0
    }

    fn slot(&self, i: usize) -> Slot {
        Slot {
            start_head: self.start_heads[i],
            start_id: self.start_ids[i],
            end_head: self.end_heads[i],
            end_id: self.end_ids[i],
            kid: self.kids[i],
        }
    }

    fn set(&mut self, i: usize, s: Slot) {
        self.start_heads[i] = s.start_head;
        self.start_ids[i] = s.start_id;
        self.end_heads[i] = s.end_head;
        self.end_ids[i] = s.end_id;
        self.kids[i] = s.kid;
    }

    // The shifts below move one slot at a time on purpose: five short
    // copy_within calls per insert cost more in call overhead than the
    // few slots they move.
    fn insert_at(&mut self, i: usize, s: Slot) {
        let n = self.len();
        debug_assert!(n < CAP);
        for j in (i..n).rev() {
            self.set(j + 1, self.slot(j));
        }
        self.set(i, s);
        self.len += 1;
    }

    fn remove_at(&mut self, i: usize) {
        let n = self.len();
        for j in i + 1..n {
            self.set(j - 1, self.slot(j));
        }
        self.len -= 1;
    }
}

/// A slot's contents, moved between nodes when they split or rebalance.
#[derive(Clone, Copy)]
struct Slot {
    start_head: u64,
    start_id: u32,
    end_head: u64,
    end_id: u32,
    kid: u32,
}

/// The keys of the entries a tree indexes.  Keys do not change while an
/// entry is in a tree.
pub trait Keys {
    fn start(&self, e: u32) -> &KeyBuf;
    fn end(&self, e: u32) -> &KeyBuf;
}

/// A tree's nodes, read-only.  `node(n)` is any node id this tree links to.
pub trait Nodes {
    fn node(&self, n: u32) -> &Node;
    /// Hints that node `n` will be read soon.
    #[inline(always)]
    fn prefetch(&self, _n: u32) {}
}

/// A tree's nodes, writable, and the pool new nodes come from.
pub trait NodesMut: Nodes {
    fn node_mut(&mut self, n: u32) -> &mut Node;
    /// Two distinct nodes at once (a split or a rebalance moves slots
    /// between them).
    fn two_mut(&mut self, a: u32, b: u32) -> (&mut Node, &mut Node);
    /// A node from the pool; its contents are overwritten by the caller.
    fn alloc_node(&mut self) -> u32;
    fn free_node(&mut self, n: u32);
}

/// Slot `i`'s least (start, id) against (`k`, `id`), by the cached head first.
#[inline(always)]
fn cmp_key<K: Keys + ?Sized>(keys: &K, x: &Node, i: usize, k: &KeyBuf, id: u32) -> Ordering {
    match x.start_heads[i].cmp(&k.head()) {
        Ordering::Equal => keys.start(x.start_ids[i]).cmp(k).then(x.start_ids[i].cmp(&id)),
        o => o,
    }
}

/// Slot `i`'s least start against `k` (ids aside).
#[inline(always)]
fn cmp_start<K: Keys + ?Sized>(keys: &K, x: &Node, i: usize, k: &KeyBuf) -> Ordering {
    match x.start_heads[i].cmp(&k.head()) {
        Ordering::Equal => keys.start(x.start_ids[i]).cmp(k),
        o => o,
    }
}

/// Slot `i`'s greatest end against `k`.
#[inline(always)]
fn cmp_end<K: Keys + ?Sized>(keys: &K, x: &Node, i: usize, k: &KeyBuf) -> Ordering {
    match x.end_heads[i].cmp(&k.head()) {
        Ordering::Equal => keys.end(x.end_ids[i]).cmp(k),
        o => o,
    }
}

/// How many of `x`'s slots hold keys at or below (`k`, `id`).  Heads are
/// sorted, so the slots whose head ties with `k`'s are contiguous and only
/// they need the full key.
#[inline(always)]
fn count_le<K: Keys + ?Sized>(keys: &K, x: &Node, k: &KeyBuf, id: u32) -> usize {
    let h = k.head();
    let n = x.len();
    let (mut lt, mut le) = (0, 0);
    for &sh in &x.start_heads[..n] {
        lt += usize::from(sh < h);
        le += usize::from(sh <= h);
    }
    while lt < le && cmp_key(keys, x, lt, k, id) != Ordering::Greater {
        lt += 1;
    }
    lt
}

/// Node `n`'s own summary as a slot of its parent: its least key and its
/// greatest end.
fn summarize<N: Nodes + ?Sized, K: Keys + ?Sized>(nodes: &N, keys: &K, n: u32) -> Slot {
    let x = nodes.node(n);
    let mut best = 0;
    for i in 1..x.len() {
        let better = match x.end_heads[i].cmp(&x.end_heads[best]) {
            Ordering::Equal => keys.end(x.end_ids[i]) > keys.end(x.end_ids[best]),
            o => o == Ordering::Greater,
        };
        if better {
            best = i;
        }
    }
    Slot {
        start_head: x.start_heads[0],
        start_id: x.start_ids[0],
        end_head: x.end_heads[best],
        end_id: x.end_ids[best],
        kid: n,
    }
}

fn alloc<N: NodesMut + ?Sized>(nodes: &mut N, height: u16) -> u32 {
    let n = nodes.alloc_node();
    assert!(n != NIL, "latch tree node pool exhausted (sized by tree::pool_size)");
    *nodes.node_mut(n) = Node { height, ..Node::EMPTY };
    n
}

/// Moves the upper half of overfull node `n` to a new right sibling.
fn split<N: NodesMut + ?Sized>(nodes: &mut N, n: u32) -> u32 {
    let height = nodes.node(n).height;
    let r = alloc(nodes, height);
    let (x, y) = nodes.two_mut(n, r);
    let keep = x.len() - x.len() / 2;
    for i in keep..x.len() {
        y.set(i - keep, x.slot(i));
    }
    y.len = (x.len() - keep) as u16;
    x.len = keep as u16;
    r
}

/// Inserts entry `e` and returns the new root.
pub fn insert<N: NodesMut + ?Sized, K: Keys + ?Sized>(nodes: &mut N, keys: &K, root: u32, e: u32) -> u32 {
    let (start, end) = (keys.start(e), keys.end(e));
    let new = Slot { start_head: start.head(), start_id: e, end_head: end.head(), end_id: e, kid: NIL };
    if root == NIL {
        let n = alloc(nodes, 0);
        nodes.node_mut(n).insert_at(0, new);
        return n;
    }
    // Descend, widening each summary on the way: `e` joins every subtree
    // on the path, so only its keys can move their bounds.
    let mut path = [(NIL, 0usize); MAX_DEPTH];
    let mut depth = 0;
    let mut n = root;
    loop {
        let x = nodes.node_mut(n);
        let pos = count_le(keys, x, start, e);
        if x.is_leaf() {
            x.insert_at(pos, new);
            break;
        }
        let c = pos.saturating_sub(1);
        if pos == 0 {
            (x.start_heads[0], x.start_ids[0]) = (new.start_head, e);
        }
        if cmp_end(keys, x, c, end) == Ordering::Less {
            (x.end_heads[c], x.end_ids[c]) = (new.end_head, e);
        }
        path[depth] = (n, c);
        depth += 1;
        n = x.kids[c];
        nodes.prefetch(n);
    }
    // Split overfull nodes bottom up.
    while nodes.node(n).len() > FANOUT {
        let r = split(nodes, n);
        let (left, right) = (summarize(nodes, keys, n), summarize(nodes, keys, r));
        if depth == 0 {
            let height = nodes.node(n).height + 1;
            let top = alloc(nodes, height);
            let t = nodes.node_mut(top);
            t.insert_at(0, left);
            t.insert_at(1, right);
            return top;
        }
        depth -= 1;
        let (p, c) = path[depth];
        let x = nodes.node_mut(p);
        x.set(c, left);
        x.insert_at(c + 1, right);
        n = p;
    }
    root
}

/// Removes entry `e`, which must be in the tree, and returns the new root.
pub fn remove<N: NodesMut + ?Sized, K: Keys + ?Sized>(nodes: &mut N, keys: &K, root: u32, e: u32) -> u32 {
    let start = keys.start(e);
    let mut path = [(NIL, 0usize); MAX_DEPTH];
    let mut depth = 0;
    let mut n = root;
    assert!(n != NIL, "latch tree: entry {e} not found");
    loop {
        let x = nodes.node_mut(n);
        if x.is_leaf() {
            let i = x.start_ids[..x.len()].iter().position(|&id| id == e);
            x.remove_at(i.unwrap_or_else(|| panic!("latch tree: entry {e} not found")));
            break;
        }
        let c = count_le(keys, x, start, e);
        assert!(c > 0, "latch tree: entry {e} not found");
        path[depth] = (n, c - 1);
        depth += 1;
        n = x.kids[c - 1];
        nodes.prefetch(n);
    }
    // Walk up: refill an underfull node from a sibling, and recompute the
    // summaries that named `e` (no other bound can have moved).
    while depth > 0 {
        depth -= 1;
        let (p, c) = path[depth];
        if nodes.node(n).len() < MIN {
            rebalance(nodes, keys, p, c);
        } else if nodes.node(p).start_ids[c] == e || nodes.node(p).end_ids[c] == e {
            let s = summarize(nodes, keys, n);
            nodes.node_mut(p).set(c, s);
        }
        n = p;
    }
    let x = nodes.node(root);
    if x.len() == 0 {
        nodes.free_node(root);
        return NIL;
    }
    if !x.is_leaf() && x.len() == 1 {
        let only = x.kids[0];
        nodes.free_node(root);
        return only;
    }
    root
}

/// Child `c` of `p` fell below [`MIN`]: merge it with a neighbour when
/// evening the two out cannot fill both to [`MIN`], else even them out.
/// Merging two that would just fit (a full node) is what the next insert
/// there splits again: alternating inserts and removals at that spot would
/// allocate and free a node every time.
fn rebalance<N: NodesMut + ?Sized, K: Keys + ?Sized>(nodes: &mut N, keys: &K, p: u32, c: usize) {
    let x = nodes.node(p);
    let li = if c + 1 < x.len() { c } else { c - 1 };
    let (l, r) = (x.kids[li], x.kids[li + 1]);
    let (a, b) = nodes.two_mut(l, r);
    let total = a.len() + b.len();
    if total < 2 * MIN {
        for i in 0..b.len() {
            a.set(a.len() + i, b.slot(i));
        }
        a.len = total as u16;
        nodes.free_node(r);
        let left = summarize(nodes, keys, l);
        let x = nodes.node_mut(p);
        x.remove_at(li + 1);
        x.set(li, left);
        return;
    }
    let want = total / 2;
    if a.len() < want {
        let k = want - a.len();
        for i in 0..k {
            a.set(a.len() + i, b.slot(i));
        }
        a.len = want as u16;
        for i in k..b.len() {
            b.set(i - k, b.slot(i));
        }
        b.len -= k as u16;
    } else {
        let k = a.len() - want;
        for i in (0..b.len()).rev() {
            b.set(i + k, b.slot(i));
        }
        for i in 0..k {
            b.set(i, a.slot(want + i));
        }
        b.len += k as u16;
        a.len = want as u16;
    }
    let (left, right) = (summarize(nodes, keys, l), summarize(nodes, keys, r));
    let x = nodes.node_mut(p);
    x.set(li, left);
    x.set(li + 1, right);
}

/// Calls `f` for every entry overlapping `q`, in start order, until `f`
/// returns false.  Returns false when stopped early.
pub fn for_each_overlap<N: Nodes + ?Sized, K: Keys + ?Sized>(
    nodes: &N,
    keys: &K,
    root: u32,
    q: &Span,
    f: &mut dyn FnMut(u32) -> bool,
) -> bool {
    if q.is_empty() || root == NIL {
        return true;
    }
    visit(nodes, keys, root, q, f)
}

fn visit<N: Nodes + ?Sized, K: Keys + ?Sized>(
    nodes: &N,
    keys: &K,
    n: u32,
    q: &Span,
    f: &mut dyn FnMut(u32) -> bool,
) -> bool {
    let x = nodes.node(n);
    for i in 0..x.len() {
        if cmp_start(keys, x, i, &q.end) != Ordering::Less {
            break; // this slot and the later ones start at or after the end
        }
        if cmp_end(keys, x, i, &q.start) != Ordering::Greater {
            continue; // everything below ends by the query's start
        }
        let more = if x.is_leaf() { f(x.start_ids[i]) } else { visit(nodes, keys, x.kids[i], q, f) };
        if !more {
            return false;
        }
    }
    true
}

/// Calls `f` for every entry in start order.
pub fn for_each<N: Nodes + ?Sized>(nodes: &N, root: u32, f: &mut dyn FnMut(u32)) {
    if root == NIL {
        return;
    }
    let x = nodes.node(root);
    for i in 0..x.len() {
        if x.is_leaf() {
            f(x.start_ids[i]);
        } else {
            for_each(nodes, x.kids[i], f);
        }
    }
}

/// The entry with the greatest (start, id), or NIL when empty.
pub fn last<N: Nodes + ?Sized>(nodes: &N, root: u32) -> u32 {
    let mut n = root;
    while n != NIL {
        let x = nodes.node(n);
        if x.is_leaf() {
            return x.start_ids[x.len() - 1];
        }
        n = x.kids[x.len() - 1];
    }
    NIL
}

/// The entry with the least (start, id), or NIL when empty.
pub fn first<N: Nodes + ?Sized>(nodes: &N, root: u32) -> u32 {
    if root == NIL {
        NIL
    } else {
        nodes.node(root).start_ids[0]
    }
}

/// Checks every invariant of the tree (key order, fill, exact summaries,
/// cached heads, equal leaf depth) and returns its entry count.
#[cfg(test)]
pub(crate) fn check<N: Nodes + ?Sized, K: Keys + ?Sized>(nodes: &N, keys: &K, root: u32) -> usize {
    if root == NIL {
        return 0;
    }
    let x = nodes.node(root);
    assert!(x.len() >= if x.is_leaf() { 1 } else { 2 }, "root fill");
    let mut all = Vec::new();
    for_each(nodes, root, &mut |e| all.push((*keys.start(e), e)));
    assert!(all.windows(2).all(|w| w[0] < w[1]), "entries out of (start, id) order");
    let (entries, _) = check_node(nodes, keys, root);
    assert_eq!(entries, all.len());
    entries
}

/// (entries, nodes) below `n`.
#[cfg(test)]
fn check_node<N: Nodes + ?Sized, K: Keys + ?Sized>(nodes: &N, keys: &K, n: u32) -> (usize, usize) {
    let x = nodes.node(n);
    assert!(x.len() <= FANOUT, "overfull node");
    let key = |i: usize| (*keys.start(x.start_ids[i]), x.start_ids[i]);
    for i in 1..x.len() {
        assert!(key(i - 1) < key(i), "slots out of order");
    }
    let (mut entries, mut count) = (0, 1);
    for i in 0..x.len() {
        assert_eq!(x.start_heads[i], keys.start(x.start_ids[i]).head(), "cached start head");
        assert_eq!(x.end_heads[i], keys.end(x.end_ids[i]).head(), "cached end head");
        if x.is_leaf() {
            assert_eq!(x.start_ids[i], x.end_ids[i]);
            entries += 1;
            continue;
        }
        let child = nodes.node(x.kids[i]);
        assert_eq!(child.height + 1, x.height, "leaves at one depth");
        assert!(child.len() >= MIN, "underfull node");
        let mut below = Vec::new();
        for_each(nodes, x.kids[i], &mut |e| below.push(e));
        let greatest = below.iter().map(|&e| keys.end(e)).max();
        assert_eq!(x.start_ids[i], below[0], "least key below a slot");
        // The summary must name an entry below the slot, not merely one
        // with an equal end: remove() recomputes a summary only when it
        // names the entry going away.
        assert!(below.contains(&x.end_ids[i]), "greatest end names an entry below its slot");
        assert!(Some(keys.end(x.end_ids[i])) == greatest, "greatest end below a slot");
        let (e, k) = check_node(nodes, keys, x.kids[i]);
        entries += e;
        count += k;
    }
    (entries, count)
}

/// Pool nodes the tree uses.
#[cfg(test)]
pub(crate) fn node_count<N: Nodes + ?Sized, K: Keys + ?Sized>(nodes: &N, keys: &K, root: u32) -> usize {
    if root == NIL {
        0
    } else {
        check_node(nodes, keys, root).1
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Vec-backed nodes for exercising the tree alone, from a preallocated
    /// pool.
    pub(crate) struct VecNodes {
        nodes: Vec<Node>,
        free: Vec<u32>,
        allocs: usize,
    }

    /// Fixed-up-front spans as the entries' keys.
    pub(crate) struct VecKeys(Vec<Span>);

    impl VecKeys {
        fn span(&self, e: u32) -> &Span {
            &self.0[e as usize]
        }

        /// Overwrites removed entry `e`'s keys, as reuse of its slot would,
        /// so a summary still naming it breaks the cached-head checks.
        fn poison(&mut self, e: u32) {
            self.0[e as usize] = Span::new(&[0xFF; 12], None);
        }
    }

    fn store(spans: Vec<Span>) -> (VecNodes, VecKeys) {
        let pool = pool_size(spans.len() as u32, 1) as usize;
        let nodes = VecNodes { nodes: vec![Node::EMPTY; pool], free: (0..pool as u32).rev().collect(), allocs: 0 };
        (nodes, VecKeys(spans))
    }

    impl VecNodes {
        fn in_use(&self) -> usize {
            self.nodes.len() - self.free.len()
        }
    }

    impl Nodes for VecNodes {
        fn node(&self, n: u32) -> &Node {
            &self.nodes[n as usize]
        }
    }

    impl NodesMut for VecNodes {
        fn node_mut(&mut self, n: u32) -> &mut Node {
            &mut self.nodes[n as usize]
        }
        fn two_mut(&mut self, a: u32, b: u32) -> (&mut Node, &mut Node) {
            let [x, y] = self.nodes.get_disjoint_mut([a as usize, b as usize]).expect("two distinct nodes");
            (x, y)
        }
        fn alloc_node(&mut self) -> u32 {
            self.allocs += 1;
            self.free.pop().unwrap_or(NIL)
        }
        fn free_node(&mut self, n: u32) {
            self.free.push(n)
        }
    }

    impl Keys for VecKeys {
        fn start(&self, e: u32) -> &KeyBuf {
            &self.span(e).start
        }
        fn end(&self, e: u32) -> &KeyBuf {
            &self.span(e).end
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

    fn span(a: u16, b: u16) -> Span {
        Span::new(&key_after(0, a), Some(&key_after(0, b)))
    }

    #[test]
    fn random_ops_match_naive_overlap() {
        // Heads decide every comparison / heads always tie / a mix; small
        // trees (root a leaf) and deep ones (three and four levels).
        for (prefix, target) in [(0, 40), (0, 1500), (8, 1500), (7, 1500), (0, 6000)] {
            random_ops_match_naive_overlap_with(prefix, target);
        }
    }

    fn random_ops_match_naive_overlap_with(prefix: usize, target: usize) {
        let mut rng = crate::rng::XorShift64(0x2545F4914F6CDD1D);
        let mut rnd = move || rng.next();
        let span = |a: u16, b: u16| Span::new(&key_after(prefix, a), Some(&key_after(prefix, b)));
        let total = 4 * target + 2000;
        let spans: Vec<Span> = (0..total)
            .map(|_| {
                let a = (rnd() % 1000) as u16;
                span(a, a + 1 + (rnd() % 40) as u16)
            })
            .collect();
        let (mut n, mut k) = store(spans);
        let mut root = NIL;
        let mut live: Vec<u32> = Vec::new();
        let mut next = 0u32;
        for step in 0..total {
            // Grow to the target, then churn, then drain to empty.
            let grow = if step < total - target - 200 { live.len() < target || rnd() % 2 == 0 } else { false };
            if grow && (next as usize) < total {
                let e = next;
                next += 1;
                root = insert(&mut n, &k, root, e);
                live.push(e);
            } else if !live.is_empty() {
                let i = (rnd() as usize) % live.len();
                let e = live.swap_remove(i);
                root = remove(&mut n, &k, root, e);
                k.poison(e);
            }
            if step % 97 == 0 || live.len() < 40 {
                assert_eq!(check(&n, &k, root), live.len());
                assert_eq!(node_count(&n, &k, root), n.in_use(), "pool nodes leak");
                assert!(n.in_use() as u32 <= pool_size(live.len() as u32, 1), "pool bound");
            }
            let qa = (rnd() % 1000) as u16;
            let q = span(qa, qa + (rnd() % 60) as u16);
            let mut got = Vec::new();
            for_each_overlap(&n, &k, root, &q, &mut |e| {
                got.push(e);
                true
            });
            let mut want: Vec<u32> = live.iter().copied().filter(|&e| k.span(e).overlaps(&q)).collect();
            want.sort_by_key(|&e| (k.span(e).start, e));
            assert_eq!(got, want, "prefix {prefix} step {step} query {q:?}");
        }
        assert_eq!(root, NIL, "drained");
        assert_eq!(n.in_use(), 0, "every node back in the pool");
    }

    #[test]
    fn first_and_last_are_the_extremes() {
        let (n, _, empty) = tree_of(vec![], 0);
        assert_eq!((first(&n, empty), last(&n, empty)), (NIL, NIL));
        let (n, _, root) = tree_of((0..200u16).map(|i| span(1000 - i * 3, 1001 - i * 3)).collect(), 200);
        assert_eq!((first(&n, root), last(&n, root)), (199, 0));
    }

    /// A store of `spans` with the first `n` of them inserted in id order.
    fn tree_of(spans: Vec<Span>, count: u32) -> (VecNodes, VecKeys, u32) {
        let (mut n, k) = store(spans);
        let root = (0..count).fold(NIL, |root, e| insert(&mut n, &k, root, e));
        (n, k, root)
    }

    /// 40 disjoint spans in ascending order.
    fn ascending() -> Vec<Span> {
        (0..40u16).map(|i| span(i * 10, i * 10 + 5)).collect()
    }

    #[test]
    fn churn_at_a_node_boundary_does_not_split_and_merge_each_time() {
        // 17 ascending entries: a leaf split into 9 + 8 under a root.
        let (mut n, k, mut root) = tree_of(ascending(), 17);
        let before = n.allocs;
        for _ in 0..50 {
            root = remove(&mut n, &k, root, 16);
            assert_eq!(check(&n, &k, root), 16);
            root = insert(&mut n, &k, root, 16);
            assert_eq!(check(&n, &k, root), 17);
        }
        assert_eq!(n.allocs, before, "no node allocated by the churn");
        assert_eq!(node_count(&n, &k, root), 3);
    }

    #[test]
    fn early_stop_is_honoured() {
        let (n, k, root) = tree_of(ascending(), 40);
        let mut seen = 0;
        let done = for_each_overlap(&n, &k, root, &span(0, 1000), &mut |_| {
            seen += 1;
            seen < 20
        });
        assert!(!done);
        assert_eq!(seen, 20);
    }
}
