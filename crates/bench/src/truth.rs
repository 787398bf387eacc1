//! What a rig's device could do in each window, for the learned-against-true
//! capacity chart: the rig's throttle group (QEMU `iops-total`, `bps-total`,
//! `iops-size`) as the scenario's `device.change` left it, priced with the
//! policies' model for the mix the tenants ran in the window. A device that
//! is not a rig does not say what it can do, so it gets no figure.

use iofloor_report::record::TenantWindow;
use iofloor_testbed::rig::RigSpec;

/// The rig's capacity as the run changes it, and the last window's figure.
#[derive(Debug, Clone)]
pub(crate) struct RigTruth {
    /// The rig as brought up (a VM path's rig has no limit of its own: none).
    original: Option<RigSpec>,
    /// The factor in force in the window now open, and the one a change
    /// made since (the run applies a change at a whole second before it
    /// closes the window that ends there).
    factor: f64,
    changed_to: Option<f64>,
    last: Option<f64>,
}

impl RigTruth {
    pub(crate) fn new(original: Option<RigSpec>) -> RigTruth {
        RigTruth {
            original: original.filter(|s| s.iops > 0),
            factor: 1.0,
            changed_to: None,
            last: None,
        }
    }

    /// A `device.change` applied to the rig: `factor` of the original,
    /// from the next window on.
    pub(crate) fn change(&mut self, factor: f64) {
        self.changed_to = Some(factor);
    }

    /// What the rig could serve in a window of this mix, in the model's
    /// cost units per second (1.0 = the model's capacity); a window without
    /// I/O repeats the last figure, as the simulator's does.
    pub(crate) fn for_window(&mut self, tenants: &[TenantWindow]) -> Option<f64> {
        let spec = self.original?.scaled(self.factor);
        self.factor = self.changed_to.take().unwrap_or(self.factor);
        let (ios, bytes, cost) = tenants.iter().fold((0.0, 0.0, 0.0), |acc, t| {
            (
                acc.0 + t.got.iops,
                acc.1 + t.got.bytes_per_s,
                acc.2 + t.got.cost,
            )
        });
        if ios > 0.0 && cost.is_finite() {
            self.last = Some(ios_per_second(&spec, bytes / ios) * cost / ios);
        }
        self.last
    }
}

/// I/Os of `io_bytes` each the throttle group lets through per second.
fn ios_per_second(spec: &RigSpec, io_bytes: f64) -> f64 {
    // With `iops-size`, an I/O of n units counts as n I/Os.
    let units = spec
        .size_unit
        .filter(|&u| u > 0)
        .map_or(1.0, |u| (io_bytes / u as f64).ceil().max(1.0));
    let by_iops = spec.iops as f64 / units;
    match spec.bps {
        Some(bps) if io_bytes > 0.0 => by_iops.min(bps as f64 / io_bytes),
        _ => by_iops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iofloor_report::record::Throughput;

    fn window(iops: f64, bytes_per_s: f64, cost: f64) -> TenantWindow {
        TenantWindow {
            got: Throughput {
                iops,
                bytes_per_s,
                cost,
            },
            demand: None,
            mean_latency_ms: None,
            cap_cost: None,
            active_share: None,
        }
    }

    fn spec(iops: u64, bps: Option<u64>, size_unit: Option<u64>) -> RigSpec {
        RigSpec {
            iops,
            bps,
            size_unit,
            size: 1 << 30,
        }
    }

    #[test]
    fn a_rig_at_the_models_rate_is_the_model_and_a_cut_scales_it() {
        // 4 KiB random reads priced at 1/4000 each: the 4,000-IOPS rig is 1.0.
        let mut truth = RigTruth::new(Some(spec(4000, None, None)));
        let ran = [window(3000.0, 3000.0 * 4096.0, 0.75)];
        assert!((truth.for_window(&ran).unwrap() - 1.0).abs() < 1e-9);
        // A change made as a window closes counts from the next one.
        truth.change(0.6);
        assert!((truth.for_window(&ran).unwrap() - 1.0).abs() < 1e-9);
        assert!((truth.for_window(&ran).unwrap() - 0.6).abs() < 1e-9);
        // No I/O in a window: the last figure stands.
        assert!((truth.for_window(&[window(0.0, 0.0, 0.0)]).unwrap() - 0.6).abs() < 1e-9);
    }

    #[test]
    fn bytes_and_io_size_limits_count_for_large_ios() {
        // 64 KiB I/Os against 100 MiB/s: 1,600 of them, not 4,000.
        let by_bytes = ios_per_second(&spec(4000, Some(100 << 20), None), 65536.0);
        assert!((by_bytes - 1600.0).abs() < 1e-9);
        // With iops-size 16 KiB, each 64 KiB I/O counts as 4.
        let by_size = ios_per_second(&spec(4000, None, Some(16384)), 65536.0);
        assert!((by_size - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn a_device_that_is_no_rig_says_nothing() {
        let mut truth = RigTruth::new(None);
        assert_eq!(truth.for_window(&[window(100.0, 409600.0, 0.1)]), None);
        let mut vm_path = RigTruth::new(Some(spec(0, None, None)));
        assert_eq!(vm_path.for_window(&[window(100.0, 409600.0, 0.1)]), None);
    }
}
