//! The README's first command: `service-mirror demo` tells its whole story. Where real
//! nodes can run (root with the node's packages, the data-plane and node binaries and the
//! images built; always as root under CI=true) the controller runs as a Pod and a client
//! Pod sends the requests; where only network namespaces can (root, the data-plane
//! binaries built) the requests come from west's node namespace; otherwise the story runs
//! without traffic. Whatever did not run is said in one `skipped:` line. `--no-nodes` and
//! `--no-traffic` force the other two.

use std::process::Command;
use std::time::Instant;

/// One demo at a time: each starts three clusters (with data planes, or real nodes).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `service-mirror demo <args>`; returns its stdout after checking it succeeded and
/// told the whole story.
fn demo(args: &[&str]) -> String {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_service-mirror"))
        .arg("demo")
        .args(args)
        .output()
        .expect("run service-mirror demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("demo {args:?} took {:?}", started.elapsed());
    for line in [
        "every mirror gets the gateway's address",
        "web-east ",
        "metrics=4143",
        "gateway moves to",
        "not ready",
        "reviews-north",
        "0 violation(s)",
        // north is linked by a Link, east by a Secret; check passes on both.
        "$ service-mirror check",
        "√ Link north is valid",
        "√ Secret cluster-credentials-east is valid",
        "Status check results are √",
        "Story told in",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    assert!(!stdout.contains("did not converge"));
    stdout
}

fn skip_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("skipped:"))
        .collect()
}

/// Whether `scripts/build-images.sh` has its images in place (it checks
/// `SERVICE_MIRROR_IMAGES_DIR` itself when set).
fn images_present() -> bool {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/build-images.sh");
    let Ok(out) = Command::new("bash").args([script, "--print"]).output() else {
        return false;
    };
    let dir = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    out.status.success()
        && ["service-mirror.tar", "pause.tar", "busybox.tar", "pause"]
            .iter()
            .all(|f| dir.join(f).is_file())
}

/// Whether the demo must run on real nodes here: as root under CI=true (where it fails
/// if it cannot), or with the node's packages, every binary and the images in place.
fn nodes_expected() -> bool {
    let root = local_cluster::data_plane_support().is_ok();
    (std::env::var("CI").as_deref() == Ok("true") && root)
        || (local_cluster::node_support().is_ok()
            && local_cluster::built_data_plane_binaries().is_some()
            && local_cluster::built_node_binaries().is_some()
            && images_present())
}

/// Whether the demo must send traffic here: as root with the data plane's tools and
/// binaries, and always under CI=true (where the demo fails if it cannot).
fn traffic_expected() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || (local_cluster::data_plane_support().is_ok()
            && local_cluster::built_data_plane_binaries().is_some())
}

#[test]
fn the_demo_runs_the_controller_as_a_pod_on_real_nodes_where_it_can() {
    if !nodes_expected() {
        // The demo's other modes, and its skip line: the next test.
        eprintln!("skipped: real nodes cannot run here (root, node binaries, images)");
        return;
    }
    let stdout = demo(&[]);
    assert!(skip_lines(&stdout).is_empty(), "{stdout}");
    for line in [
        // install's output, applied: the controller Pod from the local image leads.
        "$ service-mirror install --image service-mirror.local/service-mirror:dev",
        "the controller Pod service-mirror-",
        "(image service-mirror.local/service-mirror:dev); leader Lease held by service-mirror-",
        "controller leader present (Lease linkerd-multicluster/service-mirror): service-mirror-",
        // Every mirror answers the client Pod from its remote's workload Pod, through the
        // remote's gateway Pod.
        "GET http://web-east.shop.svc.cluster.local/            -> 200 \"east/web\"",
        "GET http://cart-east.shop.svc.cluster.local/           -> 200 \"east/cart\"",
        "GET http://payments-north.shop.svc.cluster.local/      -> 200 \"north/payments\"",
        "GET http://search-north.shop.svc.cluster.local/        -> 200 \"north/search\"",
        "GET http://web-east.shop.svc.cluster.local:9090/       -> 200 \"east/web:metrics\"",
        // The gateway's LoadBalancer address moves; requests follow, the old one is shut.
        "East's gateway moves to 198.19.",
        "-> 200 \"east/web\"  (through the new address",
        "no longer leads to the gateway",
        "wget: bad address 'search-north.shop.svc.cluster.local'",
        // The gateway Pod deleted: no request answers; a new one: they do again.
        "10 x GET http://web-east.shop.svc.cluster.local/: 10 failed",
        "-> 200 \"east/web\"  (again, after",
        // The outage: traffic keeps flowing.
        "while north's apiserver was down",
        " requests, 0 failed",
        "-> 200 \"north/reviews\"",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

#[test]
fn the_demo_tells_its_story_with_real_traffic_where_it_can() {
    if nodes_expected() {
        // The same story with the controller in this process and requests from west's
        // node namespace: what users get before the node binaries are built.
        let stdout = demo(&["--no-nodes"]);
        assert_eq!(
            skip_lines(&stdout),
            vec!["skipped: real nodes: --no-nodes"],
            "{stdout}"
        );
        assert_traffic(&stdout);
        return;
    }
    let stdout = demo(&[]);
    // One line says what did not run, and the one command that builds what it needs.
    let skipped = skip_lines(&stdout);
    assert_eq!(skipped.len(), 1, "{stdout}");
    assert!(!stdout.contains("client Pod"), "{stdout}");
    // As root only a missing build stops real nodes (without root nothing builds root).
    if local_cluster::data_plane_support().is_ok() {
        assert!(skipped[0].contains("`scripts/build-"), "{stdout}");
    }
    if !traffic_expected() {
        assert!(!stdout.contains("GET http://"), "{stdout}");
        return;
    }
    assert_traffic(&stdout);
}

/// The lines of the story with traffic from west's node namespace.
fn assert_traffic(stdout: &str) {
    for line in [
        // Every mirror answers from its remote's workload, through DNS and kube-proxy.
        "GET http://web-east.shop.svc.cluster.local/            -> 200 \"east/web\"",
        "GET http://cart-east.shop.svc.cluster.local/           -> 200 \"east/cart\"",
        "GET http://payments-north.shop.svc.cluster.local/      -> 200 \"north/payments\"",
        "GET http://search-north.shop.svc.cluster.local/        -> 200 \"north/search\"",
        // The added port.
        "GET http://web-east.shop.svc.cluster.local:9090/       -> 200 \"east/web:metrics\"",
        // The gateway moves onto the fabric's extra addresses, the requests follow.
        "East's gateway moves to 198.19.",
        "-> 200 \"east/web\"  (through the new gateway only",
        "search-north.shop.svc.cluster.local no longer resolves",
        // The gateway dies: requests fail fast; it returns: they succeed.
        "East's gateway dies",
        ": 10 failed at once (slowest",
        "-> 200 \"east/web\"  (again, after",
        // The outage: traffic keeps flowing.
        "while north's apiserver was down",
        " requests, 0 failed",
        "-> 200 \"north/reviews\"",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

#[test]
fn without_traffic_the_demo_says_in_one_line_what_it_skipped() {
    let stdout = demo(&["--no-traffic"]);
    assert_eq!(
        skip_lines(&stdout),
        vec!["skipped: real traffic through the mirrors: --no-traffic"],
        "{stdout}"
    );
    assert!(!stdout.contains("GET http://"), "{stdout}");
    // The gateways at documentation addresses, never contacted.
    assert!(stdout.contains("gateway moves to 192.0.2.11"), "{stdout}");
}
