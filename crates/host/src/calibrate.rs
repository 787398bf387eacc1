//! `iofloor calibrate`: measures a device's cost model with fio, in the
//! io.cost form (rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops), and
//! the queue depth where its latency climbs (the floor policy's knee).
//!
//! Linux's own fio-based generator (iocost_coef_gen.py) is known to be overly
//! optimistic: it measures each parameter alone, at very deep queues, and the
//! model adds those peaks, which real mixes never reach together. Here:
//! 1. the knee is measured first (4 KiB random reads at QD 1, 2, 4 … 64: the
//!    first depth whose mean latency is 1.5× that of QD 1), and every other
//!    measurement runs at that depth: throughput at acceptable latency, not peak;
//! 2. per direction, the time per I/O is fitted against the I/O size over four
//!    sizes by least squares, instead of taking bandwidth and IOPS peaks apart;
//! 3. the model is checked on mixes it was not fitted on (read/write mixes and
//!    another size) and the error is reported; if any mix does less than the
//!    model predicts, the whole model is scaled down by the worst shortfall,
//!    so it errs on the safe side.

use crate::fio::FioJob;
use crate::HostError;
use iofloor_core::cost::{CostModel, CostModelError, CostParams};
use iofloor_core::{DirUsage, Usage};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a calibration or a model file failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("fio did no I/O on {device} ({what})")]
    NoIo { device: PathBuf, what: String },
    #[error("fitted model: {0}")]
    Fit(CostModelError),
    /// A model file that does not parse; the message carries line and key.
    #[error("{path}: {source}")]
    ModelFileSyntax {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("{path}: `model`: {source}")]
    ModelFileModel {
        path: PathBuf,
        source: CostModelError,
    },
    #[error("{path}: `policy.floor.queue_knee` must be positive, got {knee}")]
    ModelFileKnee { path: PathBuf, knee: f64 },
}

impl CalibrateError {
    /// Bad input (a model file), as opposed to a measurement that failed.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            CalibrateError::ModelFileSyntax { .. }
                | CalibrateError::ModelFileModel { .. }
                | CalibrateError::ModelFileKnee { .. }
                | CalibrateError::Io { .. }
        )
    }
}

type Result<T> = std::result::Result<T, CalibrateError>;

#[derive(Debug, Clone, Serialize)]
pub struct HeldOut {
    pub name: String,
    pub measured_iops: f64,
    pub predicted_iops: f64,
    /// (measured − predicted) / predicted.
    pub error: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub device: PathBuf,
    pub params: CostParams,
    pub queue_knee: f64,
    /// Mean latency of 4 KiB random reads at QD 1, µs.
    pub qd1_latency_us: f64,
    pub held_out: Vec<HeldOut>,
    /// Factor the fitted model was scaled by after the held-out check (≤ 1).
    pub safety_scale: f64,
}

impl Calibration {
    /// The model file: what `iofloor bench --model` and the daemon's
    /// `model_file` read, with the calibration's figures as comments.
    pub fn to_toml(&self) -> String {
        let file = ModelFile {
            model: self.params,
            policy: ModelFilePolicy {
                floor: ModelFileFloor {
                    queue_knee: Some((self.queue_knee * 10.0).round() / 10.0),
                },
            },
        };
        let held_out: Vec<String> = self
            .held_out
            .iter()
            .map(|h| format!("{} {:+.1}%", h.name, h.error * 100.0))
            .collect();
        format!(
            "# iofloor calibrate {}: io.cost-style linear model (bytes/s and 4 KiB IOPS)\n\
             # held-out mixes: {}\n# safety scale applied: {:.3}\n{}",
            self.device.display(),
            held_out.join(", "),
            self.safety_scale,
            toml::to_string(&file).expect("a model file always serialises"),
        )
    }
}

struct Runner<'a> {
    device: &'a Path,
    work: &'a Path,
    secs: f64,
    n: u32,
}

impl Runner<'_> {
    /// Runs one fio measurement; returns (IOPS, mean completion latency µs).
    fn measure(
        &mut self,
        rw: &str,
        bs: u64,
        iodepth: u32,
        rwmixread: Option<u8>,
    ) -> Result<(f64, f64)> {
        self.n += 1;
        let mut job = FioJob::new(
            format!("cal{}", self.n),
            self.device,
            rw,
            bs,
            iodepth,
            self.secs,
            self.work.join(format!("cal{}.json", self.n)),
        );
        job.rwmixread = rwmixread;
        job.size = 256 << 20;
        // Devices (and QEMU's throttle) grant a burst at start: not counted.
        job.ramp_s = Some(1.0);
        let out = job.run()?;
        let j = out.jobs.first().ok_or_else(|| CalibrateError::NoIo {
            device: self.device.to_path_buf(),
            what: format!("{rw} {bs}: fio reported no job"),
        })?;
        let iops = j.read.iops + j.write.iops;
        let ios = (j.read.total_ios + j.write.total_ios).max(1) as f64;
        let lat = (j.read.clat_ns.mean * j.read.total_ios as f64
            + j.write.clat_ns.mean * j.write.total_ios as f64)
            / ios
            / 1e3;
        if iops <= 0.0 {
            return Err(CalibrateError::NoIo {
                device: self.device.to_path_buf(),
                what: format!("{rw} {bs}"),
            });
        }
        Ok((iops, lat))
    }

    /// The least queue depth (of 2..64) whose latency is 1.5 times QD 1's
    /// (64 if none is), and QD 1's latency.
    fn queue_knee(&mut self) -> Result<(f64, f64)> {
        let (_, qd1_lat) = self.measure("randread", 4096, 1, None)?;
        for qd in [2u32, 4, 8, 16, 32, 64] {
            let (_, lat) = self.measure("randread", 4096, qd, None)?;
            if lat >= 1.5 * qd1_lat {
                return Ok((qd as f64, qd1_lat));
            }
        }
        Ok((64.0, qd1_lat))
    }

    /// The model's parameters at queue depth `qd`: per direction, a line
    /// fitted through the time per I/O of random I/Os of every size, and
    /// sequential 4 KiB I/Os.
    fn fit(&mut self, qd: u32, progress: &dyn Fn(&str)) -> Result<CostParams> {
        let mut dir_params = Vec::new();
        for (rw, seq_rw) in [("randread", "read"), ("randwrite", "write")] {
            progress(&format!("{rw} at QD {qd}, sizes 4 KiB..256 KiB"));
            let mut points = Vec::new();
            for bs in SIZES {
                let (iops, _) = self.measure(rw, bs, qd, None)?;
                points.push((bs as f64, 1.0 / iops));
            }
            let (base, per_byte) = fit_line(&points);
            let (bps, randiops) = to_params(base, per_byte);
            progress(&format!("{seq_rw} 4 KiB sequential at QD {qd}"));
            let (seqiops, _) = self.measure(seq_rw, 4096, qd, None)?;
            dir_params.push((bps, seqiops.max(randiops), randiops));
        }
        Ok(CostParams {
            rbps: dir_params[0].0,
            rseqiops: dir_params[0].1,
            rrandiops: dir_params[0].2,
            wbps: dir_params[1].0,
            wseqiops: dir_params[1].1,
            wrandiops: dir_params[1].2,
        })
    }

    /// Mixes the fit did not see, measured against what `model` predicts.
    fn held_out(&mut self, model: &CostModel, qd: u32) -> Result<Vec<HeldOut>> {
        let mut held_out = Vec::new();
        for (name, rw, bs, mix) in [
            ("randrw 70/30 8KiB", "randrw", 8192u64, Some(70u8)),
            ("randrw 30/70 32KiB", "randrw", 32768, Some(30)),
            ("randwrite 128KiB", "randwrite", 131072, None),
        ] {
            let (iops, _) = self.measure(rw, bs, qd, mix)?;
            let read_share = match rw {
                "randread" => 1.0,
                "randwrite" => 0.0,
                _ => mix.unwrap_or(50) as f64 / 100.0,
            };
            let one = Usage {
                read: DirUsage {
                    ios: read_share,
                    bytes: read_share * bs as f64,
                    seq_ios: 0.0,
                },
                write: DirUsage {
                    ios: 1.0 - read_share,
                    bytes: (1.0 - read_share) * bs as f64,
                    seq_ios: 0.0,
                },
                latency_us: None,
            };
            let predicted = 1.0 / model.cost_rate(&one);
            held_out.push(HeldOut {
                name: name.into(),
                measured_iops: iops,
                predicted_iops: predicted,
                error: (iops - predicted) / predicted,
            });
        }
        Ok(held_out)
    }
}

/// Least-squares fit of y = a + b·x.
fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - b * mx, b)
}

const SIZES: [u64; 4] = [4096, 16384, 65536, 262144];

/// Converts a fitted (base seconds, seconds per byte) into io.cost's (bps, 4 KiB IOPS).
fn to_params(base: f64, per_byte: f64) -> (f64, f64) {
    // A device whose cost does not grow with size has "infinite" bandwidth:
    // cap it at 100 GB/s so the model stays finite.
    let per_byte = per_byte.max(1e-11);
    let base = base.max(0.0);
    (1.0 / per_byte, 1.0 / (base + 4096.0 * per_byte))
}

pub fn calibrate(
    device: &Path,
    work: &Path,
    secs: f64,
    progress: &dyn Fn(&str),
) -> Result<Calibration> {
    std::fs::create_dir_all(work).map_err(|source| CalibrateError::Io {
        path: work.to_path_buf(),
        source,
    })?;
    let mut r = Runner {
        device,
        work,
        secs,
        n: 0,
    };

    progress("queue knee (4 KiB random reads, QD 1..64)");
    let (knee, qd1_lat) = r.queue_knee()?;
    let qd = (knee as u32).max(1);
    let params = r.fit(qd, progress)?;
    let model = CostModel::new(params).map_err(CalibrateError::Fit)?;
    progress("held-out mixes");
    let held_out = r.held_out(&model, qd)?;
    // Err on the safe side: if any held-out mix did less than predicted, the
    // device is slower than the model there; scale the model down to match.
    let safety_scale = held_out
        .iter()
        .map(|h| (1.0 + h.error).min(1.0))
        .fold(1.0, f64::min);
    let params = CostParams {
        rbps: params.rbps * safety_scale,
        rseqiops: params.rseqiops * safety_scale,
        rrandiops: params.rrandiops * safety_scale,
        wbps: params.wbps * safety_scale,
        wseqiops: params.wseqiops * safety_scale,
        wrandiops: params.wrandiops * safety_scale,
    };
    Ok(Calibration {
        device: device.to_path_buf(),
        params,
        queue_knee: knee,
        qd1_latency_us: qd1_lat,
        held_out,
        safety_scale,
    })
}

/// The calibrated-model file: written by [`Calibration::to_toml`], read by
/// `iofloor bench --model` and the daemon's `model_file` (serde both ways).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub model: CostParams,
    #[serde(default)]
    pub policy: ModelFilePolicy,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFilePolicy {
    #[serde(default)]
    pub floor: ModelFileFloor,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFileFloor {
    pub queue_knee: Option<f64>,
}

impl ModelFile {
    /// Reads and validates a model file; errors name the file, and the line
    /// and key where the parser knows them.
    pub fn load(path: &Path) -> Result<(CostModel, Option<f64>)> {
        let text = std::fs::read_to_string(path).map_err(|source| CalibrateError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ModelFile::parse(&text, path)
    }

    /// [`ModelFile::load`] on text already read; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<(CostModel, Option<f64>)> {
        let f: ModelFile =
            toml::from_str(text).map_err(|source| CalibrateError::ModelFileSyntax {
                path: path.to_path_buf(),
                source,
            })?;
        let model = CostModel::new(f.model).map_err(|source| CalibrateError::ModelFileModel {
            path: path.to_path_buf(),
            source,
        })?;
        if let Some(knee) = f.policy.floor.queue_knee.filter(|k| !(*k > 0.0)) {
            return Err(CalibrateError::ModelFileKnee {
                path: path.to_path_buf(),
                knee,
            });
        }
        Ok((model, f.policy.floor.queue_knee))
    }
}

/// Rough run time of a calibration, for the user.
pub fn planned(secs: f64) -> Duration {
    Duration::from_secs_f64((secs + 1.0) * 20.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_file_round_trips() {
        let cal = Calibration {
            device: PathBuf::from("/dev/loop9"),
            params: CostParams {
                rbps: 2e8,
                rseqiops: 9000.0,
                rrandiops: 4000.0,
                wbps: 1e8,
                wseqiops: 5000.0,
                wrandiops: 2000.0,
            },
            queue_knee: 2.04,
            qd1_latency_us: 250.0,
            held_out: vec![],
            safety_scale: 0.97,
        };
        let (model, knee) = ModelFile::parse(&cal.to_toml(), Path::new("m.toml")).unwrap();
        assert_eq!(*model.params(), cal.params);
        assert_eq!(knee, Some(2.0));
    }

    #[test]
    fn bad_model_files_name_file_and_key() {
        let e = ModelFile::parse("[model]\nrbps = 1\n", Path::new("m.toml")).unwrap_err();
        assert!(e.is_bad_input() && e.to_string().contains("m.toml"), "{e}");
        let good = "[model]\nrbps = 2e8\nrseqiops = 9000\nrrandiops = 4000\nwbps = 1e8\nwseqiops = 5000\nwrandiops = 2000\n";
        let e = ModelFile::parse(
            &format!("{good}[policy.floor]\nqueue_knee = -1\n"),
            Path::new("m.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("queue_knee"), "{e}");
        let e = ModelFile::parse(
            &good.replace("rbps = 2e8", "rbps = -5"),
            Path::new("m.toml"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("`model`"), "{e}");
    }

    #[test]
    fn line_fit() {
        let (a, b) = fit_line(&[(1.0, 3.0), (2.0, 5.0), (3.0, 7.0)]);
        assert!((a - 1.0).abs() < 1e-12 && (b - 2.0).abs() < 1e-12);
    }

    #[test]
    fn params_from_a_fit() {
        // 100 µs per I/O plus 1 ns per byte: 1 GB/s, and a 4 KiB I/O takes 104.096 µs.
        let (bps, iops) = to_params(100e-6, 1e-9);
        assert!((bps - 1e9).abs() < 1.0);
        assert!((iops - 1.0 / 104.096e-6).abs() < 1e-6);
    }
}
