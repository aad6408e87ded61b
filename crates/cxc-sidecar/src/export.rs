//! Export of the sidecar's view through the [`metrics`] facade (feature `metrics`).
//!
//! After every poll of an instance, with labels `kind` (lease, heartbeat, semaphore, cell, rwlock) and
//! `instance` (its name):
//!
//! | metric | type | value |
//! |---|---|---|
//! | `cxc_events_total{counter}` | counter | each cumulative in-file counter |
//! | `cxc_observations_total{op}` | counter | observations per op seen by this process |
//! | `cxc_observations_lost_total` | counter | observations lost before a poll read them |
//! | `cxc_wait_p90_ns` | gauge | 90th percentile of the observed waits |
//! | `cxc_spin_budget_ns` | gauge | spin budget of the current strategy (-1 = primitive default) |
//! | `cxc_strategy_generation` | gauge | generation of the current strategy |

use cxc_mmf::Kind;

use crate::op::OpCode;
use crate::stats::Stats;

pub(crate) fn export(kind: Kind, name: &str, stats: &Stats) {
    let kind = kind.name();
    for (counter, value) in &stats.counters {
        metrics::counter!(
            "cxc_events_total",
            "kind" => kind,
            "instance" => name.to_owned(),
            "counter" => *counter
        )
        .absolute(*value);
    }
    for (&code, &n) in &stats.ops {
        let op = match OpCode::from_u16(code) {
            OpCode::Unknown(c) => format!("{c:#06x}"),
            op => op.name().to_owned(),
        };
        metrics::counter!(
            "cxc_observations_total",
            "kind" => kind,
            "instance" => name.to_owned(),
            "op" => op
        )
        .absolute(n);
    }
    metrics::counter!(
        "cxc_observations_lost_total",
        "kind" => kind,
        "instance" => name.to_owned()
    )
    .absolute(stats.lost);
    metrics::gauge!("cxc_wait_p90_ns", "kind" => kind, "instance" => name.to_owned())
        .set(stats.waits.quantile(0.9) as f64);
    let budget = stats
        .strategy
        .spin_budget()
        .map_or(-1.0, |d| d.as_nanos() as f64);
    metrics::gauge!("cxc_spin_budget_ns", "kind" => kind, "instance" => name.to_owned())
        .set(budget);
    metrics::gauge!("cxc_strategy_generation", "kind" => kind, "instance" => name.to_owned())
        .set(f64::from(stats.generation));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    use crate::{
        AdaptiveInstance, HandshakeHeader, ObservationRing, OpCode, Sidecar, SidecarBox, Strategy,
        counter_values,
    };

    type Values = Arc<Mutex<BTreeMap<String, f64>>>;

    /// Records the last value of every metric, keyed `name{k=v,...}`.
    #[derive(Default)]
    struct Capture(Values);

    struct Cell(Values, String);

    impl CounterFn for Cell {
        fn increment(&self, v: u64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() += v as f64;
        }
        fn absolute(&self, v: u64) {
            self.0.lock().unwrap().insert(self.1.clone(), v as f64);
        }
    }

    impl GaugeFn for Cell {
        fn increment(&self, v: f64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() += v;
        }
        fn decrement(&self, v: f64) {
            *self.0.lock().unwrap().entry(self.1.clone()).or_default() -= v;
        }
        fn set(&self, v: f64) {
            self.0.lock().unwrap().insert(self.1.clone(), v);
        }
    }

    fn render(key: &Key) -> String {
        let labels: Vec<String> = key
            .labels()
            .filter(|l| l.key() != "instance")
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }

    impl Recorder for Capture {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Cell(self.0.clone(), render(key))))
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::from_arc(Arc::new(Cell(self.0.clone(), render(key))))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    #[derive(Default)]
    struct Heap {
        counters: [AtomicU64; 2],
        hs: HandshakeHeader,
        ring: ObservationRing,
    }

    impl AdaptiveInstance for Heap {
        fn kind(&self) -> cxc_mmf::Kind {
            cxc_mmf::Kind::Semaphore
        }
        fn name(&self) -> String {
            "heap".into()
        }
        fn ring(&self) -> &ObservationRing {
            &self.ring
        }
        fn handshake(&self) -> &HandshakeHeader {
            &self.hs
        }
        fn counters(&self) -> Vec<(&'static str, u64)> {
            counter_values(&["reclaims", "timeouts"], &self.counters)
        }
    }

    #[test]
    fn poll_exports_counters_and_stats() {
        static SIDECAR: Sidecar = Sidecar::new();
        let inst = SidecarBox::new_in(&SIDECAR, Heap::default(), None);
        inst.counters[0].store(5, std::sync::atomic::Ordering::Relaxed);
        inst.ring.record(OpCode::SemReclaim, 0, 2);
        inst.ring.record(OpCode::SemContended, 0, 3_000);
        inst.ring.record_code(0x0999, 0, 0);
        inst.hs.publish(Strategy::Spin { budget_ns: 4096 });
        let capture = Capture::default();
        metrics::with_local_recorder(&capture, || SIDECAR.poll());
        let v = capture.0.lock().unwrap().clone();
        let get = |k: &str| v.get(k).copied().unwrap_or_else(|| panic!("{k} in {v:?}"));
        assert_eq!(
            get("cxc_events_total{kind=semaphore,counter=reclaims}"),
            5.0
        );
        assert_eq!(
            get("cxc_events_total{kind=semaphore,counter=timeouts}"),
            0.0
        );
        assert_eq!(
            get("cxc_observations_total{kind=semaphore,op=semaphore.reclaim}"),
            1.0
        );
        assert_eq!(get("cxc_observations_total{kind=semaphore,op=0x0999}"), 1.0);
        assert_eq!(get("cxc_observations_lost_total{kind=semaphore}"), 0.0);
        assert_eq!(get("cxc_spin_budget_ns{kind=semaphore}"), 4096.0);
        assert_eq!(get("cxc_strategy_generation{kind=semaphore}"), 1.0);
        assert!(get("cxc_wait_p90_ns{kind=semaphore}") >= 3_000.0);
    }
}
