use super::*;
use crate::cpu::types::traits as all_traits;

fn read(dir: &str, name: &str) -> Vec<u8> {
    std::fs::read(format!("{dir}/{name}")).unwrap_or_else(|e| panic!("{dir}/{name}: {e}"))
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
#[ignore]
fn ggml_cross_check() {
    let Ok(dir) = std::env::var("ROCMFORGE_QCHECK") else {
        return;
    };
    const N: usize = 4096;
    let x = floats(&read(&dir, "x.f32"));
    let y = floats(&read(&dir, "y.f32"));
    let rows = x.len() / N;
    use GgmlType::*;
    let mut dot_mismatches = vec![];
    for t in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
    ] {
        let tr = all_traits(t).unwrap();
        let vt = tr.vec_dot_type;
        let (xr, yr) = (t.row_size(N), vt.row_size(N));
        let gq = read(&dir, &format!("{}.q", t.name()));
        let gy = read(&dir, &format!("{}.y", t.name()));
        let gdeq = floats(&read(&dir, &format!("{}.deq", t.name())));
        let gdot = floats(&read(&dir, &format!("{}.dot", t.name())));
        let gdot_odd = floats(&read(&dir, &format!("{}.dot_odd", t.name())));
        let mut mine_y = vec![0u8; yr * rows];
        let mut mine_q = vec![0u8; xr * rows];
        let mut deq = vec![0f32; N];
        for r in 0..rows {
            unsafe {
                (all_traits(vt).unwrap().from_f32.unwrap())(
                    &y[r * N..(r + 1) * N],
                    mine_y.as_mut_ptr().add(r * yr),
                );
                (tr.from_f32.unwrap())(&x[r * N..(r + 1) * N], mine_q.as_mut_ptr().add(r * xr));
                (tr.to_f32.unwrap())(gq.as_ptr().add(r * xr), &mut deq);
            }
            assert_eq!(
                deq[..],
                gdeq[r * N..(r + 1) * N],
                "{t:?} dequantize row {r}"
            );
            // Dots follow ggml-cpu's summation order, so they agree to the bit; the odd
            // block count reaches the kernels' tails.
            for (n, want) in [(N, gdot[r]), (N - t.block_size(), gdot_odd[r])] {
                let d = unsafe {
                    (tr.vec_dot.unwrap())(n, gq.as_ptr().add(r * xr), gy.as_ptr().add(r * yr))
                };
                if d.to_bits() != want.to_bits() {
                    dot_mismatches.push(format!("{t:?} row {r} n={n}: {d} vs ggml {want}"));
                }
            }
        }
        assert!(mine_y == gy, "{vt:?} activation bytes differ from ggml-cpu");
        // Every quantizer reproduces ggml-cpu's bytes (the K-quants and IQ4_NL through
        // `kquant_search`, ggml's reference searches).
        assert!(mine_q == gq, "{t:?} quantized bytes differ from ggml-cpu");
    }
    assert!(
        dot_mismatches.is_empty(),
        "dots differ from ggml-cpu's:\n{}",
        dot_mismatches.join("\n")
    );
}
