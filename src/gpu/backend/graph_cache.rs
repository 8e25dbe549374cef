//! Captured graphs kept besides the last one (`ROCMFORGE_GPU_GRAPH_CACHE`, default 128 a
//! backend). One model on one GPU repeats its last graph, and `GpuBackend::compute_graph`
//! replays that; ggml's tensor-parallel meta device (`-sm tensor`) instead gives each GPU's
//! backend one graph per layer part, a different one every call, and a token repeats the whole
//! sequence. Without this every such part ran launch by launch (host-bound: ~65 graphs a token).
//! Here a graph seen before, not necessarily just before, is captured, and a captured graph
//! whose key (`graph_key`: every address, shape, parameter, the scratch and the buffers' free
//! epoch) equals a new graph's is replayed instead. Kept graphs are plain ones (no row-split
//! products); the least recently used one goes when the cache is full.

use crate::gpu::api::GraphExec;

/// A captured graph and what `GpuBackend` keeps beside its executable.
pub(crate) struct Kept {
    pub key: Vec<u64>,
    pub exec: GraphExec,
    pub nodes: Option<usize>,
    pub shape: u64,
    hash: u64,
    used: u64,
}

pub(crate) struct GraphCache {
    cap: usize,
    kept: Vec<Kept>,
    /// Hashes of graphs run launch by launch lately (twice `cap` at most, oldest first).
    seen: std::collections::VecDeque<u64>,
    tick: u64,
}

/// FNV-1a over the key's words.
pub(super) fn key_hash(key: &[u64]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &w| {
        (h ^ w).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl GraphCache {
    pub fn new(cap: usize) -> GraphCache {
        GraphCache {
            cap,
            kept: Vec::new(),
            seen: Default::default(),
            tick: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// The kept graph of exactly this key, taken out of the cache.
    pub fn take(&mut self, key: &[u64]) -> Option<Kept> {
        let h = key_hash(key);
        let i = self.kept.iter().position(|k| k.hash == h && k.key == key)?;
        Some(self.kept.swap_remove(i))
    }

    /// Whether a graph of this key ran lately; notes it if not.
    pub fn seen_before(&mut self, key: &[u64]) -> bool {
        let h = key_hash(key);
        if self.seen.contains(&h) {
            return true;
        }
        if self.seen.len() >= 2 * self.cap.max(1) {
            self.seen.pop_front();
        }
        self.seen.push_back(h);
        false
    }

    /// Keeps a captured graph; returns the executable pushed out to make room (the caller
    /// destroys it once its stream no longer runs it).
    pub fn put(
        &mut self,
        key: Vec<u64>,
        exec: GraphExec,
        nodes: Option<usize>,
        shape: u64,
    ) -> Option<GraphExec> {
        self.tick += 1;
        let hash = key_hash(&key);
        let out = if self.kept.len() >= self.cap {
            let (i, _) = self.kept.iter().enumerate().min_by_key(|(_, k)| k.used)?;
            Some(self.kept.swap_remove(i).exec)
        } else {
            None
        };
        self.kept.push(Kept {
            key,
            exec,
            nodes,
            shape,
            hash,
            used: self.tick,
        });
        out
    }

    /// Every kept executable, the cache emptied (the caller destroys them).
    pub fn drain(&mut self) -> Vec<GraphExec> {
        self.seen.clear();
        self.kept.drain(..).map(|k| k.exec).collect()
    }

    /// Drops graphs whose key no longer can match: made before `prefix` (scratch address and
    /// the buffers' free epoch) changed. Returns their executables.
    pub fn stale(&mut self, prefix: &[u64]) -> Vec<GraphExec> {
        let mut out = Vec::new();
        self.kept.retain(|k| {
            let keep = k.key.starts_with(prefix);
            if !keep {
                out.push(k.exec);
            }
            keep
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_exact_keys_and_evicts_the_least_recently_used() {
        let mut c = GraphCache::new(2);
        assert!(c.put(vec![1, 2, 3], GraphExec(10), None, 0).is_none());
        assert!(c.put(vec![1, 2, 4], GraphExec(11), None, 0).is_none());
        assert!(c.take(&[1, 2]).is_none(), "a prefix is not the key");
        let k = c.take(&[1, 2, 3]).unwrap();
        assert_eq!(k.exec, GraphExec(10));
        // Put back as the newest: [1,2,4] is now the oldest and goes first.
        assert!(c.put(k.key, k.exec, None, 0).is_none());
        assert_eq!(c.put(vec![9], GraphExec(12), None, 0), Some(GraphExec(11)));
        assert_eq!(c.len(), 2);
        assert_eq!(c.stale(&[1, 2]), vec![GraphExec(12)]);
        assert_eq!(c.drain(), vec![GraphExec(10)]);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_key_is_seen_before_from_its_second_time() {
        let mut c = GraphCache::new(1);
        assert!(!c.seen_before(&[5]));
        assert!(!c.seen_before(&[6]));
        assert!(c.seen_before(&[5]));
        // Two remembered for a capacity of one: a third pushes the oldest out.
        assert!(!c.seen_before(&[7]));
        assert!(!c.seen_before(&[5]));
    }
}
