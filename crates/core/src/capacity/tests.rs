use super::*;
use std::time::Duration;

/// Replays the steps of a trace (`IOFLOOR_REPLAY=file.json`, a list of
/// `CapacityStep`s as the status API shows them) and prints what the loop
/// makes of each; a tool for reading a live run, not a check.
#[test]
#[ignore]
fn replay() {
    let path = std::env::var("IOFLOOR_REPLAY").expect("IOFLOOR_REPLAY");
    let steps: Vec<CapacityStep> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut c = CapacityLoop::new(
        CapacitySettings {
            latency_target_us: None,
            min_factor: 0.05,
            max_factor: 16.0,
        },
        1.0,
    );
    for s in steps {
        c.update(&Observation {
            latency_us: s.latency_us,
            avg_queue: s.avg_queue,
            served: s.served,
            capped: s.capped,
            capped_shortfall: s.capped_shortfall,
            wants_more: s.wants_more,
            floor_share: s.floor_share,
            floors_need: s.floors_need,
            handed_out: 0.97,
            interval: Some(Duration::from_secs(1)),
            departed: s.departed,
            early: s.early,
        });
        let step = c.last_step().unwrap();
        eprintln!(
            "{:?} {:?} est {:.3} plateau {:?} served {:.3} early {} pts {:?}",
            step.verdict,
            step.phase,
            step.estimate,
            step.plateau,
            step.served,
            step.early,
            c.curve()
                .points()
                .map(|p| (p.served * 1000.0).round() / 1000.0)
                .collect::<Vec<_>>()
        );
    }
}
