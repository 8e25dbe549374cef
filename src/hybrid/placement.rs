//! Which weights RFHYBRID keeps in VRAM: each candidate's value per byte, and the choice within
//! the budget.

use crate::ggml_types::op;
use crate::tensor::Tensor;

/// A weight that could be kept in VRAM, and the time a byte of it saves there relative to
/// others (1: read whole by every graph; experts: the share of them a token reads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub host: usize,
    pub len: usize,
    pub value: f64,
    /// The layer the weight belongs to (`blk.N.` in its name), if any: a layer is kept or
    /// streamed whole.
    pub layer: Option<u32>,
}

/// The layer number in a weight's name (`blk.12.ffn_up.weight` -> 12).
pub fn layer_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("blk.")?;
    rest[..rest.find('.')?].parse().ok()
}

/// What a byte of source `i` of `n` is worth in VRAM: the experts of MUL_MAT_ID are read
/// sparsely (a token reads n_used of n_expert), everything else whole.
pub fn weight_value(n: &Tensor, i: usize) -> f64 {
    if n.op() == op::MUL_MAT_ID && i == 0 {
        let experts = n.src(0).map_or(1, |w| w.ne()[2].max(1));
        let used = n.src(2).map_or(1, |ids| ids.ne()[0].max(1));
        (used as f64 / experts as f64).min(1.0)
    } else {
        1.0
    }
}

/// The weights to keep in VRAM within `room` bytes: the most valuable per byte first (dense
/// weights of every layer before any experts: what --cpu-moe does by hand). Where a value's
/// weights do not all fit, the ones kept are spread evenly over the graph, a layer at a time:
/// a streamed layer then follows a resident one, so the copies of its weights overlap the
/// resident layer's compute (the first half of the layers resident and the second streamed
/// leaves the copy stream idle for the first half and the GPU waiting on it in the second).
pub fn choose_resident(candidates: &[Candidate], room: &mut usize) -> Vec<Candidate> {
    // Units in graph order: a layer's weights together, any other weight alone; a weight used
    // twice counts once, where it is first used.
    let mut units: Vec<(f64, Vec<Candidate>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for c in candidates {
        if !seen.insert(c.host) {
            continue;
        }
        let joins = units.iter_mut().rev().find(|(v, u)| {
            *v == c.value && c.layer.is_some() && u.first().is_some_and(|f| f.layer == c.layer)
        });
        match joins {
            Some((_, u)) => u.push(*c),
            None => units.push((c.value, vec![*c])),
        }
    }
    let mut values: Vec<f64> = units.iter().map(|u| u.0).collect();
    values.sort_by(|a, b| b.total_cmp(a));
    values.dedup();
    let bytes = |u: &[Candidate]| u.iter().map(|c| c.len).sum::<usize>();
    let mut out = Vec::new();
    for v in values {
        let of_value: Vec<&Vec<Candidate>> =
            units.iter().filter(|u| u.0 == v).map(|u| &u.1).collect();
        let total: usize = of_value.iter().map(|u| bytes(u)).sum();
        let share = if total == 0 {
            1.0
        } else {
            (*room as f64 / total as f64).min(1.0)
        };
        // Error diffusion: a unit is kept when the bytes kept so far stay within `share` of
        // the bytes seen so far (half a unit of slack, so that one in two is kept at 0.5).
        let (mut seen_bytes, mut kept) = (0usize, 0usize);
        for u in of_value {
            let b = bytes(u);
            seen_bytes += b;
            if b <= *room && (kept + b) as f64 <= share * seen_bytes as f64 + 0.5 * b as f64 {
                *room -= b;
                kept += b;
                out.extend(u.iter().copied());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(host: usize, len: usize, value: f64) -> Candidate {
        Candidate {
            host,
            len,
            value,
            layer: None,
        }
    }

    fn l(host: usize, len: usize, layer: u32) -> Candidate {
        Candidate {
            host,
            len,
            value: 1.0,
            layer: Some(layer),
        }
    }

    fn hosts(cands: &[Candidate], room: &mut usize) -> Vec<usize> {
        choose_resident(cands, room)
            .iter()
            .map(|c| c.host)
            .collect()
    }

    /// Dense weights of every layer before any experts; a weight used twice is counted once.
    #[test]
    fn dense_first_then_experts() {
        let cands = [
            c(0, 10, 1.0),
            c(100, 40, 8.0 / 128.0),
            c(200, 10, 1.0),
            c(300, 40, 8.0 / 128.0),
            c(0, 10, 1.0),
            c(400, 10, 1.0),
        ];
        let mut room = 75;
        assert_eq!(hosts(&cands, &mut room), vec![0, 200, 400, 100]);
        assert_eq!(room, 5);
        let mut room = 0;
        assert!(choose_resident(&cands, &mut room).is_empty());
        // Everything fits: everything kept.
        let mut room = 1000;
        assert_eq!(hosts(&cands, &mut room).len(), 5);
    }

    /// Half the budget keeps every other layer, each layer whole; a third keeps one in three;
    /// weights of no layer are spread as units of their own.
    #[test]
    fn kept_layers_are_spread_over_the_graph() {
        let cands: Vec<Candidate> = (0..16u32).map(|i| l(i as usize * 100, 10, i / 2)).collect();
        let mut room = 80;
        assert_eq!(
            hosts(&cands, &mut room),
            vec![0, 100, 400, 500, 800, 900, 1200, 1300]
        );
        assert_eq!(room, 0);
        let cands: Vec<Candidate> = (0..9u32).map(|i| l(i as usize * 100, 10, i)).collect();
        let mut room = 30;
        let got = hosts(&cands, &mut room);
        assert_eq!(got.len(), 3);
        assert!(got.windows(2).all(|w| w[1] - w[0] >= 200), "{got:?}");
        let cands: Vec<Candidate> = (0..6).map(|i| c(i * 100, 10, 1.0)).collect();
        let mut room = 30;
        assert_eq!(hosts(&cands, &mut room), vec![0, 200, 400]);
    }

    #[test]
    fn layer_numbers_from_names() {
        assert_eq!(layer_of("blk.12.ffn_up.weight"), Some(12));
        assert_eq!(layer_of("blk.0.attn_q.weight"), Some(0));
        assert_eq!(layer_of("output.weight"), None);
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
        assert_eq!(layer_of("blk.7"), None);
    }

    #[test]
    fn experts_are_worth_the_share_a_token_reads() {
        use crate::ggml_types::GgmlType;
        use crate::hybrid::synth::Synth;
        let w = Synth::new(GgmlType::Q4_0, [256, 64, 128, 1]);
        let x = Synth::new(GgmlType::F32, [256, 8, 1, 1]);
        let ids = Synth::new(GgmlType::I32, [8, 1, 1, 1]);
        let mut n = Synth::new(GgmlType::F32, [64, 8, 1, 1]);
        n.op(op::MUL_MAT_ID).src(0, &w).src(1, &x).src(2, &ids);
        assert_eq!(weight_value(&n.tensor(), 0), 8.0 / 128.0);
        let mut m = Synth::new(GgmlType::F32, [64, 8, 1, 1]);
        m.op(op::MUL_MAT).src(0, &w).src(1, &x);
        assert_eq!(weight_value(&m.tensor(), 0), 1.0);
    }
}
