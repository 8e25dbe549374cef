//! RFHYBRID's measured choices kept across processes: each graph shape's plan-trial winner (by
//! the plan's own fingerprint: which candidate comes first depends on the online corrections, so
//! a later process takes the kept plan only where one of its candidates is that plan) and
//! the expert-sharing width (`SplitTuner`) at a thread count, where it won by 3% or more (a near
//! tie is measured again by the next process). Both are measured on the running
//! graphs (a MoE process spent its first ~40 tokens on them: a 32-token benchmark ran at
//! 65-75 t/s where the settled process makes ~100), so they are written to the kernel cache's
//! directory beside the cost model's profile, under the same machine key, and a later process
//! with a graph of the same shape starts from them. The trial is still run again every
//! `TRIAL_REUSE`-th time a shape is planned; `ROCMFORGE_HYBRID_CALIBRATE=force` (measure the
//! machine again) and `ROCMFORGE_HYBRID_TRIAL=force` start from nothing.
//!
//! The file: a header line, then `trial <shape> <plan>` (the winner's `plan_fingerprint`) and
//! `width <shape> <threads> <slots>` lines, shapes and plans as 16 hex digits. Unreadable lines are
//! skipped; a file that cannot be written leaves the choices to this process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

const HEADER: &str = "rocmforge-hybrid-learned 2";

#[derive(Default, Debug, PartialEq)]
pub struct Learned {
    /// Where they are kept; None: in this process only.
    path: Option<PathBuf>,
    trial: HashMap<u64, u64>,
    width: HashMap<(u64, usize), usize>,
}

/// `hybrid-learned-<hash of key>.txt` in `dir` (`key`: the cost profile's machine key).
pub fn cache_file(dir: &Path, key: &str) -> PathBuf {
    super::calibrate::keyed_file(dir, "hybrid-learned", key)
}

impl Learned {
    /// The choices kept at `path` (none when it is absent or `fresh`); later ones are written
    /// there.
    pub fn load(path: Option<PathBuf>, fresh: bool) -> Learned {
        let mut l = match path.as_deref().filter(|_| !fresh) {
            Some(p) => Self::from_text(&std::fs::read_to_string(p).unwrap_or_default()),
            None => Learned::default(),
        };
        l.path = path;
        l
    }

    /// The fingerprint of the plan that won this shape's trial.
    pub fn trial(&self, shape: u64) -> Option<u64> {
        self.trial.get(&shape).copied()
    }

    pub fn width(&self, shape: u64, threads: usize) -> Option<usize> {
        self.width.get(&(shape, threads)).copied()
    }

    pub fn set_trial(&mut self, shape: u64, winner: u64) {
        if self.trial.insert(shape, winner) != Some(winner) {
            self.save();
        }
    }

    pub fn set_width(&mut self, shape: u64, threads: usize, slots: usize) {
        if self.width.insert((shape, threads), slots) != Some(slots) {
            self.save();
        }
    }

    fn save(&self) {
        let Some(path) = &self.path else { return };
        // Written whole, then renamed over: a process reading it sees the old or the new file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let ok =
            std::fs::write(&tmp, self.to_text()).is_ok() && std::fs::rename(&tmp, path).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
            crate::log_debug!(
                "RFHYBRID: cannot keep the measured choices in {}",
                path.display()
            );
        }
    }

    fn to_text(&self) -> String {
        let mut lines: Vec<String> = self
            .trial
            .iter()
            .map(|(s, w)| format!("trial {s:016x} {w:016x}"))
            .chain(
                self.width
                    .iter()
                    .map(|((s, t), w)| format!("width {s:016x} {t} {w}")),
            )
            .collect();
        lines.sort();
        format!("{HEADER}\n{}\n", lines.join("\n"))
    }

    fn from_text(text: &str) -> Learned {
        let mut l = Learned::default();
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return l;
        }
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            let shape = |s: &str| u64::from_str_radix(s, 16).ok();
            match f.as_slice() {
                ["trial", s, w] => {
                    if let (Some(s), Some(w)) = (shape(s), shape(w)) {
                        l.trial.insert(s, w);
                    }
                }
                ["width", s, t, w] => {
                    if let (Some(s), Ok(t), Ok(w)) = (shape(s), t.parse(), w.parse()) {
                        l.width.insert((s, t), w);
                    }
                }
                _ => {}
            }
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one process learned, the next reads back; bad lines and a wrong header are
    /// skipped, `fresh` ignores the file.
    #[test]
    fn choices_survive_a_process_and_bad_lines_are_skipped() {
        let dir = std::env::temp_dir().join(format!("rf-learned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = cache_file(&dir, "cpu=Test; gpu=Test");
        let mut a = Learned::load(Some(path.clone()), false);
        assert_eq!(a.trial(7), None);
        a.set_trial(7, 0x1234);
        a.set_trial(0xdead_beef_0000_0001, u64::MAX);
        a.set_width(7, 16, 4);
        a.set_width(7, 4, 2);
        let b = Learned::load(Some(path.clone()), false);
        assert_eq!(b, a);
        assert_eq!(b.trial(7), Some(0x1234));
        assert_eq!(b.trial(0xdead_beef_0000_0001), Some(u64::MAX));
        assert_eq!(
            (b.width(7, 16), b.width(7, 4), b.width(7, 8)),
            (Some(4), Some(2), None)
        );
        assert_eq!(Learned::load(Some(path.clone()), true).trial(7), None);

        let text = format!("{HEADER}\ntrial zz 1\ntrial 0000000000000009 x2\nwidth 9 x 1\nwidth 0000000000000009 8 3\nnonsense\n");
        std::fs::write(&path, text).unwrap();
        let c = Learned::load(Some(path.clone()), false);
        assert_eq!((c.trial(9), c.width(9, 8)), (None, Some(3)));
        std::fs::write(
            &path,
            "rocmforge-hybrid-learned 1\ntrial 0000000000000009 1\n",
        )
        .unwrap();
        assert_eq!(Learned::load(Some(path.clone()), false).trial(9), None);
        // No place to keep them: this process only.
        let mut d = Learned::load(Some(dir.join("missing").join("f.txt")), false);
        d.set_width(1, 2, 3);
        assert_eq!(d.width(1, 2), Some(3));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
