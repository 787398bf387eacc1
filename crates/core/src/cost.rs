//! The device cost model: a linear model in the form Linux's io.cost uses
//! (`rbps rseqiops rrandiops wbps wseqiops wrandiops`), so a model measured for
//! the kernel can be used here and the other way round.
//!
//! The cost of one I/O is `base(direction, seq|rand) + bytes * per_byte(direction)`,
//! in seconds of the whole device: a cost rate of 1.0 per second is the device
//! fully busy. Like blk-iocost, the per-byte part comes from the bandwidth and
//! the base part is what remains of a 4 KiB I/O's cost at the given IOPS, so a
//! 4 KiB random read costs exactly `1/rrandiops`.
//!
//! Charging by cost is what makes floors fair across I/O sizes: a 4 KiB burst
//! has small bandwidth but can keep the device as busy as a 64 KiB stream.

use crate::model::{Caps, DirUsage, Direction, Usage};
use crate::units::Rate;
use serde::{Deserialize, Serialize};

/// The six io.cost model parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostParams {
    pub rbps: f64,
    pub rseqiops: f64,
    pub rrandiops: f64,
    pub wbps: f64,
    pub wseqiops: f64,
    pub wrandiops: f64,
}

const PAGE: f64 = 4096.0;

#[derive(Debug, Clone, Copy, PartialEq)]
struct DirCoef {
    per_byte: f64,
    seq_base: f64,
    rand_base: f64,
}

impl DirCoef {
    fn new(bps: f64, seqiops: f64, randiops: f64) -> DirCoef {
        let per_byte = 1.0 / bps;
        let page_cost = PAGE * per_byte;
        DirCoef {
            per_byte,
            seq_base: (1.0 / seqiops - page_cost).max(0.0),
            rand_base: (1.0 / randiops - page_cost).max(0.0),
        }
    }

    fn cost(&self, u: &DirUsage) -> f64 {
        let seq = u.seq_ios.min(u.ios);
        seq * self.seq_base + (u.ios - seq) * self.rand_base + u.bytes * self.per_byte
    }
}

/// A validated cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    params: CostParams,
    read: DirCoef,
    write: DirCoef,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cost model field `{field}` must be a positive number, got {value}")]
pub struct CostModelError {
    pub field: &'static str,
    pub value: f64,
}

impl CostModel {
    pub fn new(params: CostParams) -> Result<CostModel, CostModelError> {
        let fields = [
            ("rbps", params.rbps),
            ("rseqiops", params.rseqiops),
            ("rrandiops", params.rrandiops),
            ("wbps", params.wbps),
            ("wseqiops", params.wseqiops),
            ("wrandiops", params.wrandiops),
        ];
        for (field, value) in fields {
            if !(value.is_finite() && value > 0.0) {
                return Err(CostModelError { field, value });
            }
        }
        Ok(CostModel {
            params,
            read: DirCoef::new(params.rbps, params.rseqiops, params.rrandiops),
            write: DirCoef::new(params.wbps, params.wseqiops, params.wrandiops),
        })
    }

    pub fn params(&self) -> &CostParams {
        &self.params
    }

    fn coef(&self, d: Direction) -> &DirCoef {
        match d {
            Direction::Read => &self.read,
            Direction::Write => &self.write,
        }
    }

    /// Cost of a single I/O, in device-seconds.
    pub fn io_cost(&self, d: Direction, bytes: f64, sequential: bool) -> f64 {
        let c = self.coef(d);
        (if sequential { c.seq_base } else { c.rand_base }) + bytes * c.per_byte
    }

    /// Cost rate of a usage, in device-seconds per second (1.0 = device full).
    pub fn cost_rate(&self, u: &Usage) -> f64 {
        self.read.cost(&u.read) + self.write.cost(&u.write)
    }

    /// A rate stated in any unit, as a cost rate for a tenant whose traffic
    /// has the shape of `mix`. `None` when the rate is in IOPS or bytes and
    /// `mix` carries no I/O to take the shape from.
    pub fn rate_to_cost(&self, rate: Rate, mix: &Usage) -> Option<f64> {
        match rate {
            Rate::Cost(c) => Some(c),
            Rate::Iops(n) => (mix.iops() > 0.0).then(|| n * self.cost_rate(mix) / mix.iops()),
            Rate::BytesPerSec(b) => {
                (mix.bytes_per_sec() > 0.0).then(|| b * self.cost_rate(mix) / mix.bytes_per_sec())
            }
        }
    }

    /// A cost rate, expressed in the unit of `unit_of` for traffic shaped like `mix`.
    pub fn cost_to_rate(&self, cost: f64, unit_of: Rate, mix: &Usage) -> Option<f64> {
        let per_unit = self.rate_to_cost(
            match unit_of {
                Rate::Iops(_) => Rate::Iops(1.0),
                Rate::BytesPerSec(_) => Rate::BytesPerSec(1.0),
                Rate::Cost(_) => Rate::Cost(1.0),
            },
            mix,
        )?;
        (per_unit > 0.0).then(|| cost / per_unit)
    }

    /// Kernel caps that hold a tenant whose traffic is shaped like `mix` to at
    /// most `cost` per second.
    ///
    /// The cap is split between reads and writes by their share of the mix's
    /// cost, and each direction gets an IOPS and a bytes/s cap whose combined
    /// cost is exactly its share, so no mix of sizes can exceed it. A direction
    /// the mix does not use keeps a small allowance (`IDLE_SHARE`) rather than
    /// being shut, so a tenant that starts reading is slowed, not stopped, until
    /// the next decision sees its new mix.
    pub fn caps_for_cost(&self, cost: f64, mix: &Usage) -> Caps {
        const IDLE_SHARE: f64 = 0.05;
        let cost = cost.max(0.0);
        let read_cost = self.read.cost(&mix.read);
        let write_cost = self.write.cost(&mix.write);
        let total = read_cost + write_cost;
        let (read_share, write_share) = if total > 0.0 {
            (read_cost / total, write_cost / total)
        } else {
            (0.5, 0.5)
        };
        let dir_caps = |d: Direction, share: f64, u: &DirUsage| -> (f64, f64) {
            let c = self.coef(d);
            let budget = cost * share.max(IDLE_SHARE);
            // Size and sequential share of this direction, or a 4 KiB random I/O.
            let (size, seq_frac) = match u.avg_size() {
                Some(size) => (size, (u.seq_ios / u.ios).clamp(0.0, 1.0)),
                None => (PAGE, 0.0),
            };
            let per_io = seq_frac * c.seq_base + (1.0 - seq_frac) * c.rand_base + size * c.per_byte;
            let iops = budget / per_io;
            (iops, iops * size)
        };
        let (read_iops, read_bps) = dir_caps(Direction::Read, read_share, &mix.read);
        let (write_iops, write_bps) = dir_caps(Direction::Write, write_share, &mix.write);
        Caps {
            read_iops: Some(read_iops),
            write_iops: Some(write_iops),
            read_bps: Some(read_bps),
            write_bps: Some(write_bps),
        }
    }

    /// The largest cost rate a tenant shaped like `mix` can reach under `caps`.
    pub fn cost_allowed_by(&self, caps: &Caps, mix: &Usage) -> Option<f64> {
        if caps.is_unlimited() {
            return None;
        }
        // Scale the mix up until the first cap binds.
        let mut k = f64::INFINITY;
        for d in [Direction::Read, Direction::Write] {
            let u = mix.dir(d);
            if let (Some(cap), true) = (caps.iops(d), u.ios > 0.0) {
                k = k.min(cap / u.ios);
            }
            if let (Some(cap), true) = (caps.bps(d), u.bytes > 0.0) {
                k = k.min(cap / u.bytes);
            }
        }
        k.is_finite().then(|| k * self.cost_rate(mix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn ssd() -> CostModel {
        CostModel::new(CostParams {
            rbps: 2e9,
            rseqiops: 400e3,
            rrandiops: 300e3,
            wbps: 1e9,
            wseqiops: 200e3,
            wrandiops: 100e3,
        })
        .unwrap()
    }

    fn writes(ios: f64, size: f64) -> Usage {
        Usage {
            write: DirUsage {
                ios,
                bytes: ios * size,
                seq_ios: 0.0,
            },
            ..Default::default()
        }
    }

    #[test]
    fn four_kib_random_costs_one_over_randiops() {
        let m = ssd();
        assert!((m.io_cost(Direction::Read, 4096.0, false) - 1.0 / 300e3).abs() < 1e-12);
        assert!((m.io_cost(Direction::Write, 4096.0, false) - 1.0 / 100e3).abs() < 1e-12);
        // At the model's random write IOPS the device is exactly full.
        assert!((m.cost_rate(&writes(100e3, 4096.0)) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn small_ios_are_not_free() {
        let m = ssd();
        // 4 KiB at 50k IOPS is 200 MB/s, a fifth of the write bandwidth, but half the device.
        let small = m.cost_rate(&writes(50e3, 4096.0));
        assert!(small > 0.45, "small I/O cost {small}");
    }

    #[test]
    fn caps_for_cost_hold_the_mix_to_the_cost() {
        let m = ssd();
        let mix = writes(1000.0, 65536.0);
        let caps = m.caps_for_cost(0.3, &mix);
        let allowed = m.cost_allowed_by(&caps, &mix).unwrap();
        assert!((allowed - 0.3).abs() < 1e-9, "allowed {allowed}");
        // Switching to 4 KiB I/Os cannot exceed the budget either.
        let small = writes(1.0, 4096.0);
        assert!(m.cost_allowed_by(&caps, &small).unwrap() <= 0.3 + 1e-9);
    }

    #[test]
    fn rates_convert_through_the_mix() {
        let m = ssd();
        let mix = writes(100.0, 65536.0);
        let per_io = m.io_cost(Direction::Write, 65536.0, false);
        assert!((m.rate_to_cost(Rate::Iops(10.0), &mix).unwrap() - 10.0 * per_io).abs() < 1e-12);
        let c = m
            .rate_to_cost(Rate::BytesPerSec(65536.0 * 10.0), &mix)
            .unwrap();
        assert!((c - 10.0 * per_io).abs() < 1e-12);
        let back = m.cost_to_rate(c, Rate::BytesPerSec(1.0), &mix).unwrap();
        assert!((back - 655360.0).abs() < 1e-6);
        assert_eq!(m.rate_to_cost(Rate::Iops(10.0), &Usage::default()), None);
    }

    #[test]
    fn bad_params_name_the_field() {
        let mut p = *ssd().params();
        p.wrandiops = 0.0;
        assert_eq!(CostModel::new(p).unwrap_err().field, "wrandiops");
    }
}
