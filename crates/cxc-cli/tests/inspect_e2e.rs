//! End-to-end tests of `inspect` and `watch` on the built binary: Prometheus output read
//! back by an exposition-format parser, dead/alive marks, `watch` on a missing file.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;
use common::{cxc, p, succeeds};

fn files(d: &Path) -> [std::path::PathBuf; 3] {
    let (l, s, h) = (d.join("l"), d.join("s"), d.join("h"));
    succeeds(&["create", "lease", p(&l)]);
    succeeds(&["create", "sem", p(&s), "--permits", "3"]);
    succeeds(&["create", "heartbeat", p(&h), "--capacity", "4"]);
    [l, s, h]
}

#[test]
fn prometheus_output_parses_with_an_exposition_format_parser() {
    let d = tempfile::tempdir().unwrap();
    let [l, s, h] = files(d.path());
    succeeds(&["lease", "run", p(&l), "--", "true"]);
    let o = cxc(&["inspect", "--format", "prometheus", p(&l), p(&s), p(&h)])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let find = |name: &str, path: &Path| {
        scrape
            .samples
            .iter()
            .find(|x| x.metric == name && x.labels.get("path") == Some(p(path)))
            .unwrap_or_else(|| panic!("no {name} for {}:\n{text}", path.display()))
    };
    assert_eq!(
        find("cxc_semaphore_permits_available", &s).value,
        prometheus_parse::Value::Gauge(3.0)
    );
    assert_eq!(
        find("cxc_heartbeat_slots", &h).value,
        prometheus_parse::Value::Gauge(4.0)
    );
    assert_eq!(
        find("cxc_lease_held", &l).value,
        prometheus_parse::Value::Gauge(0.0)
    );
    assert!(
        matches!(find("cxc_lease_generation", &l).value, prometheus_parse::Value::Gauge(g) if g >= 1.0)
    );
    let counters: Vec<_> = scrape
        .samples
        .iter()
        .filter(|x| matches!(x.value, prometheus_parse::Value::Counter(_)))
        .collect();
    assert!(!counters.is_empty(), "no counter parsed:\n{text}");
    // Naming conventions: every family documented and typed once; counters end in _total.
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let f: Vec<_> = line.split(' ').collect();
        assert_eq!(
            text.matches(&format!("# TYPE {} ", f[2])).count(),
            1,
            "{line}"
        );
        assert!(text.contains(&format!("# HELP {} ", f[2])), "{line}");
        assert_eq!(f[3] == "counter", f[2].ends_with("_total"), "{line}");
        assert!(f[2].starts_with("cxc_"), "{line}");
    }
}

#[test]
fn inspect_marks_dead_and_alive_holders() {
    let d = tempfile::tempdir().unwrap();
    let s = d.path().join("s");
    let sem = cxc::SharedSemaphore::create(&s, 2, 2).unwrap();
    let permit = sem.acquire();
    // A child that takes a permit and is killed: its slot stays until reclaimed.
    let mut child = cxc(&["sem", "run", p(&s), "-j", "2", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while sem.available() != 0 {
        assert!(Instant::now() < end, "child never took its permit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = String::from_utf8(cxc(&["inspect", p(&s)]).output().unwrap().stdout).unwrap();
    let me = std::process::id();
    assert!(out.contains(&format!("pid {me:>8} [alive]")), "{out}");
    // kill -9 the keeper (the permit holder) and its wrapper.
    let pid = child.id();
    let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let keeper: i32 = kids.split_whitespace().next().unwrap().parse().unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(keeper).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let out = String::from_utf8(cxc(&["inspect", p(&s)]).output().unwrap().stdout).unwrap();
        if out.contains(&format!("pid {keeper:>8} [dead]")) {
            break;
        }
        assert!(Instant::now() < end, "dead holder not marked:\n{out}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(permit);
    // The orphaned `sleep 30` is in its own group, led by itself.
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid_kept = stat.contains("(sleep)");
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if ppid_kept
            && cmd == b"sleep\x0030\x00"
            && let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())
        {
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            if String::from_utf8_lossy(&env).contains(p(&s)) {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).unwrap(),
                    rustix::process::Signal::KILL,
                );
            }
        }
    }
}

#[test]
fn watch_exits_2_on_a_missing_file_and_prints_plain_reports_to_a_pipe() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing");
    let o = cxc(&["watch", p(&missing)]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(p(&missing)), "{err}");
    let [l, ..] = files(d.path());
    // --interval 0 is raised to the floor: two reports take at least 100 ms.
    let mut w = cxc(&["watch", "--interval", "0", p(&l)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut out = w.stdout.take().unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while String::from_utf8_lossy(&buf).matches("\nlease ").count() < 2 {
        let n = std::io::Read::read(&mut out, &mut chunk).unwrap();
        assert!(n > 0);
        buf.extend_from_slice(&chunk[..n]);
    }
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "no interval floor"
    );
    let _ = w.kill();
    let _ = w.wait();
    let text = String::from_utf8_lossy(&buf);
    assert!(
        !text.contains('\x1b'),
        "escapes written to a pipe: {text:?}"
    );
    // --wait-for-file waits for the file instead.
    let late = d.path().join("late");
    let mut w = cxc(&["watch", "--wait-for-file", p(&late)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(w.try_wait().unwrap().is_none(), "--wait-for-file exited");
    let _ = w.kill();
    let _ = w.wait();
}

/// `inspect` reads every file `cxc demo --keep DIR` leaves: its lease, heartbeat table,
/// semaphore and work board (a test-kind file, shown with its field names).
#[test]
fn inspect_reads_every_file_the_demo_leaves() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("demo");
    let o = cxc(&["demo", "--keep", p(&dir), "--workers", "2", "--units", "8"])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|f| f.is_file())
        .collect();
    files.sort();
    let mut kinds = Vec::new();
    for f in &files {
        let o = cxc(&["inspect", p(f)]).output().unwrap();
        if !std::fs::read(f).unwrap().starts_with(b"CXC-MMF\0") {
            // The demo's text log: named as what it is.
            assert_eq!(o.status.code(), Some(2));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains(&format!("not a cxc file: {}", p(f))), "{err}");
            continue;
        }
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "inspect {}: {}",
            f.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        kinds.push(text.split_whitespace().next().unwrap_or("").to_string());
        let o = cxc(&["inspect", "--json", p(f)]).output().unwrap();
        assert!(o.status.success());
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if v["kind"] == "test" {
            assert_eq!(v["state"]["layout"], "demo-board", "{v}");
            assert_eq!(v["state"]["board"]["units"], 8, "{v}");
            assert_eq!(v["state"]["board"]["done"], 8, "{v}");
            assert_eq!(v["state"]["board"]["violations"], 0, "{v}");
            assert_eq!(v["state"]["units"].as_array().map(Vec::len), Some(8));
            assert!(text.contains("the work board of `cxc demo`"), "{text}");
        }
    }
    kinds.sort();
    for k in ["heartbeat", "lease", "semaphore", "test"] {
        assert!(kinds.iter().any(|x| x == k), "no {k} file among {files:?}");
    }
}
