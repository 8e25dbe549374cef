//! Prefetch groups. In a token, a layer whose weights are not in VRAM runs on the CPU: reading
//! its weights there is faster than copying them over PCIe first. Meanwhile the GPU's copy
//! engine is idle. A run of consecutive CPU nodes can go to the GPU instead when its weights can
//! be copied in while the CPU nodes before it compute (the backend starts those copies before it
//! runs the CPU segment): the copy is then hidden, and the run costs its GPU time plus two
//! changes of device. The CPU and the copy engine read host memory side by side, so a token's
//! non-resident weights are read at their two rates added.
//!
//! `place_groups` runs after the plan's dynamic programming, which charges every copy in full.

/// Per-node costs from the planner, µs (index 0: CPU, 1: GPU).
pub struct Costs<'a> {
    pub compute: &'a [[f64; 2]],
    /// Moving inputs from outside the graph to each place.
    pub external: &'a [[f64; 2]],
    /// Moving earlier nodes' results at a change of place onto the node's place.
    pub switch: &'a [[f64; 2]],
    pub allowed: &'a [[bool; 2]],
    /// The lengths of the node's inputs that would stream through the arena on the GPU, and the
    /// µs of copying them (part of `external[i][1]`).
    pub streams: &'a [Vec<usize>],
    pub stream_us: &'a [f64],
    /// The fixed cost of a change of device.
    pub switch_us: f64,
}

/// Longest group tried, nodes (a layer's feed-forward block is under 10).
const MAX_GROUP: usize = 64;

/// The least share of its CPU time a group must save: a group that barely pays uses up the CPU
/// time before it that a larger group after it could have hidden its copies behind.
const MIN_SAVING: f64 = 0.5;

/// Streamed inputs laid out as the backend copies them: in order, into the arena's first half
/// and then its second, none split between the two.
struct Pack {
    half: usize,
    at: usize,
    second: bool,
}

impl Pack {
    fn add(&mut self, len: usize) -> bool {
        let len = len.next_multiple_of(super::residency::ARENA_ALIGN);
        if self.at + len <= self.half {
            self.at += len;
            return true;
        }
        if self.second || len > self.half {
            return false;
        }
        (self.second, self.at) = (true, len);
        true
    }
}

/// Moves groups of CPU nodes (`choice` 0) to the GPU (1) where their streamed inputs fit the
/// arena (two halves of `half` bytes), copy in no more time than the CPU nodes since the last
/// GPU node take, and the group saves at least `MIN_SAVING` of its CPU time. Returns the groups
/// [start, end) and, per node, the copy µs hidden.
pub fn place_groups(
    choice: &mut [usize],
    c: &Costs,
    half: usize,
) -> (Vec<(usize, usize)>, Vec<f64>) {
    let n = choice.len();
    let mut groups = Vec::new();
    let mut hidden = vec![0.0; n];
    if half == 0 {
        return (groups, hidden);
    }
    // CPU µs since the last GPU node: the time a prefetch before this CPU run has.
    let mut cpu_us = 0.0;
    let mut i = 0;
    while i < n {
        if choice[i] == 1 {
            cpu_us = 0.0;
            i += 1;
            continue;
        }
        let mut best: Option<(f64, usize)> = None;
        let (mut saved, mut gpu, mut copy_us) = (0.0, 0.0, 0.0);
        let mut pack = Pack {
            half,
            at: 0,
            second: false,
        };
        let enter = c.switch[i][1] + c.switch_us;
        for e in i..n.min(i + MAX_GROUP) {
            if choice[e] != 0 || !c.allowed[e][1] || !c.streams[e].iter().all(|&l| pack.add(l)) {
                break;
            }
            copy_us += c.stream_us[e];
            if copy_us > cpu_us {
                break;
            }
            saved += c.compute[e][0] + c.external[e][0];
            gpu += c.compute[e][1] + (c.external[e][1] - c.stream_us[e]).max(0.0);
            let leave = if e + 1 < n && choice[e + 1] == 0 {
                c.switch[e + 1][0] + c.switch_us
            } else {
                0.0
            };
            let gain = saved - gpu - enter - leave;
            if copy_us > 0.0 && gain >= MIN_SAVING * saved && best.is_none_or(|(g, _)| gain > g) {
                best = Some((gain, e + 1));
            }
        }
        match best {
            Some((_, end)) => {
                for k in i..end {
                    choice[k] = 1;
                    hidden[k] = c.stream_us[k];
                }
                groups.push((i, end));
                cpu_us = 0.0;
                i = end;
            }
            None => {
                cpu_us += c.compute[i][0] + c.external[i][0];
                i += 1;
            }
        }
    }
    (groups, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layers of 10 nodes: 9 small ones and one product whose weights (100 MB) stream; the CPU
    /// takes 1000 µs for the product, the copy 2000 µs, the GPU 50 µs.
    fn layers(count: usize) -> (Vec<[f64; 2]>, Vec<Vec<usize>>, Vec<f64>) {
        let mut compute = Vec::new();
        let mut streams = Vec::new();
        let mut stream_us = Vec::new();
        for _ in 0..count {
            for k in 0..10 {
                let big = k == 7;
                compute.push(if big { [1000.0, 50.0] } else { [5.0, 5.0] });
                streams.push(if big { vec![100 << 20] } else { vec![] });
                stream_us.push(if big { 2000.0 } else { 0.0 });
            }
        }
        (compute, streams, stream_us)
    }

    fn run(count: usize, half: usize, switch_us: f64) -> (Vec<usize>, Vec<(usize, usize)>) {
        let (compute, streams, stream_us) = layers(count);
        let n = compute.len();
        let external: Vec<[f64; 2]> = stream_us.iter().map(|&s| [0.0, s]).collect();
        let switch = vec![[2.0, 2.0]; n];
        let allowed = vec![[true, true]; n];
        let c = Costs {
            compute: &compute,
            external: &external,
            switch: &switch,
            allowed: &allowed,
            streams: &streams,
            stream_us: &stream_us,
            switch_us,
        };
        let mut choice = vec![0; n];
        let (groups, hidden) = place_groups(&mut choice, &c, half);
        for &(a, b) in &groups {
            // Each group's copies fit in the CPU time before it, since the last GPU node.
            let copy: f64 = (a..b).map(|k| stream_us[k]).sum();
            let before = (0..a).rev().take_while(|&k| choice[k] == 0);
            let cpu: f64 = before.map(|k| compute[k][0]).sum();
            assert!(copy <= cpu, "group {a}..{b}: copy {copy} > cpu {cpu}");
            assert!((a..b).all(|k| hidden[k] == stream_us[k]));
        }
        (choice, groups)
    }

    #[test]
    fn groups_follow_enough_cpu_time() {
        let (choice, groups) = run(8, 128 << 20, 100.0);
        // Two CPU layers (2090 µs) hide one layer's copy (2000 µs): every third product moves.
        assert_eq!(groups.len(), 2, "{groups:?}");
        for &(a, b) in &groups {
            assert!((a..b).any(|k| k % 10 == 7), "{groups:?}");
        }
        assert!(choice.iter().filter(|&&c| c == 1).count() < choice.len() / 2);
    }

    #[test]
    fn no_room_no_groups() {
        // No arena, or one too small for the layer's weights.
        assert!(run(8, 0, 100.0).1.is_empty());
        assert!(run(8, 50 << 20, 100.0).1.is_empty());
    }

    #[test]
    fn costly_changes_of_device_make_fewer_larger_groups() {
        // 1000 µs saved, less 50 on the GPU and two changes of 300: under half. Two products
        // (one per half of the arena) after four CPU layers pay.
        let (_, groups) = run(12, 128 << 20, 300.0);
        assert!(!groups.is_empty());
        for &(a, b) in &groups {
            assert_eq!((a..b).filter(|k| k % 10 == 7).count(), 2, "{groups:?}");
        }
        assert!(run(12, 128 << 20, 1000.0).1.is_empty());
    }

    #[test]
    fn pack_fills_two_halves_in_order() {
        let mut p = Pack {
            half: 4096,
            at: 0,
            second: false,
        };
        assert!(p.add(2048));
        assert!(p.add(1000)); // 1024 with its alignment
        assert!(!p.add(8192));
        assert!(p.add(1536)); // the second half
        assert!(p.add(2560));
        assert!(!p.add(1)); // both full
    }
}
