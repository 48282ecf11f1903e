//! The benchmark's smoke run (N=100, K=1, one repetition): it keeps the benchmark
//! working in CI. Correctness only, never time: every phase reaches every wanted
//! state (the bench fails otherwise) and the controller writes nothing while idle.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a smoke run may take: each takes ~20 s on an idle 2-core machine. A run
/// past it is killed (its clusters and controller die with it: they are tied to it by
/// the parent-death signal) and the test fails with what the bench printed, instead of
/// holding CI until its own limit (a CI run once stopped at 5,400 s with the headless
/// smoke run "running for over 60 seconds" as its last line).
const DEADLINE: Duration = Duration::from_secs(600);

/// Runs the bench with `args`, its output in files under `dir`; returns whether it
/// succeeded, its stdout and its stderr. Panics with both once past [`DEADLINE`].
fn run_bench(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("run the bench");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the bench ran past {DEADLINE:?} and was killed\n--- stdout\n{}\n--- stderr\n{}",
                read(&out),
                read(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    (status.success(), read(&out), read(&err))
}

#[test]
fn smoke_run_mirrors_every_change_and_writes_nothing_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    // `self`: this (debug) bench executable runs the controller, as `service-mirror run`
    // does, in a process of its own; no cargo build from within the test.
    let (ok, stdout, stderr) = run_bench(
        dir.path(),
        &[
            "--services",
            "100",
            "--clusters",
            "1",
            "--repetitions",
            "1",
            "--smoke",
            "--controller-bin",
            "self",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        ok,
        "bench failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("| 100 x 1 |"), "a results table: {stdout}");

    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON results")).unwrap();
    let config = &results["configs"][0];
    assert_eq!(config["services_per_cluster"], 100);
    assert_eq!(config["clusters"], 1);
    let rep = &config["repetitions"][0];
    let metric = |name: &str| rep["metrics"][name].as_f64().unwrap_or(f64::NAN);
    // No write when idle but the Leases' (the leader Lease and the link's write Lease
    // are renewed, or taken, on their own cadence: counted apart, as everywhere).
    let idle_writes: Vec<&String> = rep["idle_requests"]["by_kind"]
        .as_object()
        .expect("idle requests by kind")
        .keys()
        .filter(|k| {
            let verb = k.split(' ').next().unwrap_or_default();
            matches!(verb, "create" | "update" | "patch" | "delete") && !k.ends_with(" leases")
        })
        .collect();
    assert!(
        idle_writes.is_empty(),
        "no write when idle: {idle_writes:?} in {rep}"
    );
    assert_eq!(metric("idle_writes_per_min"), 0.0);
    // Every mirror was checked in every phase (the run fails on any one missing).
    assert_eq!(metric("gateway_samples"), 100.0, "all 100 mirrors moved");
    assert_eq!(metric("port_samples"), 5.0);
    assert_eq!(metric("unexport_samples"), 5.0);
    for m in [
        "cold_sync_s",
        "baseline_create_s",
        "baseline_endpoints_rewrite_s",
        "baseline_mirrors_rewrite_s",
        "rss_peak_mib",
        "cpu_cold_s",
    ] {
        assert!(metric(m).is_finite(), "{m} measured: {rep}");
    }
    // A cold sync writes each mirror's Service and Endpoints (and may retry a few).
    let mirror_writes = rep["cold_requests"]["by_kind"]["create services"]
        .as_u64()
        .unwrap_or(0)
        + rep["cold_requests"]["by_kind"]["create endpoints"]
            .as_u64()
            .unwrap_or(0);
    assert!(mirror_writes >= 200, "{rep}");
    assert_eq!(
        rep["controller_warnings"].as_array().map(Vec::len),
        Some(0),
        "the controller warned: {rep}"
    );
}

#[test]
fn headless_smoke_run_mirrors_every_pod_and_writes_nothing_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("headless.json");
    let (ok, stdout, stderr) = run_bench(
        dir.path(),
        &[
            "--headless-pods",
            "30",
            "--concurrency",
            "8",
            "--controller-bin",
            "self",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        ok,
        "bench failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON results")).unwrap();
    let h = &results["headless"];
    assert_eq!(h["pods"], 30);
    // 30 endpoint mirrors and the headless mirror, each a Service, Endpoints and a slice.
    assert_eq!(h["baseline_objects"], 93, "{h}");
    assert!(h["cold_mirror_writes"].as_u64().unwrap() >= 93, "{h}");
    assert_eq!(h["idle_mirror_writes"], 0, "no write when idle: {h}");
    for m in ["cold_sync_s", "baseline_s", "rss_peak_mib"] {
        assert!(
            h[m].as_f64().is_some_and(f64::is_finite),
            "{m} measured: {h}"
        );
    }
}

/// Fleet mode at smoke size: 4 clusters on 2 remote apiservers (two links each, under
/// their own names), 20 Services each, Links. Not run by default (about a minute in a
/// debug build, and CI runs the default smoke run above); run it with
/// `cargo test -p bench --test smoke -- --ignored fleet`.
#[test]
#[ignore]
fn fleet_smoke_run_mirrors_every_link_of_shared_apiservers() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("fleet.json");
    let (ok, stdout, stderr) = run_bench(
        dir.path(),
        &[
            "--clusters",
            "4",
            "--services",
            "20",
            "--fleet-apiservers",
            "2",
            "--link-source",
            "links",
            "--endpoints-mode",
            "endpoints",
            "--repetitions",
            "1",
            "--idle-secs",
            "2",
            "--long-idle-secs",
            "0",
            "--samples",
            "2",
            "--concurrency",
            "32",
            "--smoke",
            "--controller-bin",
            "self",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        ok,
        "bench failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("Fleet:"), "a fleet table: {stdout}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON results")).unwrap();
    let config = &results["configs"][0];
    assert_eq!(config["clusters"], 4);
    assert_eq!(config["total_services"], 80);
    let rep = &config["repetitions"][0];
    let metric = |name: &str| rep["metrics"][name].as_f64().unwrap_or(f64::NAN);
    assert_eq!(metric("remote_apiservers"), 2.0);
    assert_eq!(metric("idle_writes_per_min"), 0.0);
    assert_eq!(
        metric("gateway_samples"),
        20.0,
        "all 20 mirrors of link 1 moved"
    );
    for m in [
        "cold_sync_s",
        "baseline_create_s",
        "rss_no_links_mib",
        "rss_steady_kib_per_mirror",
        "rss_steady_mib_per_link",
        "rss_peak_kib_per_mirror",
        "rss_peak_mib_per_link",
        "cpu_total_s",
    ] {
        assert!(metric(m).is_finite(), "{m} measured: {rep}");
    }
    // Every link mirrored its 20 Services: 80 Services and 80 Endpoints created.
    let created = |kind: &str| {
        rep["cold_requests"]["by_kind"][format!("create {kind}")]
            .as_u64()
            .unwrap_or(0)
    };
    assert!(
        created("services") >= 80 && created("endpoints") >= 80,
        "{rep}"
    );
}
