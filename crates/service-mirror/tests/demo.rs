//! The README's first command: `service-mirror demo` tells its whole story; where it can
//! make network namespaces (root, the data-plane binaries built; always under CI=true) it
//! sends real requests through the mirrors and shows their answers, otherwise it says in
//! one line what it skipped and why. `--no-traffic` forces the story without traffic.

use std::process::Command;
use std::time::Instant;

/// One demo at a time: each starts three clusters (with traffic, three data planes).
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
        .filter(|l| l.starts_with("skipped: real traffic"))
        .collect()
}

/// Whether the demo must send traffic here: as root with the data plane's tools and
/// binaries, and always under CI=true (where the demo fails if it cannot).
fn traffic_expected() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || (local_cluster::data_plane_support().is_ok()
            && local_cluster::built_data_plane_binaries().is_some())
}

#[test]
fn the_demo_tells_its_story_with_real_traffic_where_it_can() {
    let stdout = demo(&[]);
    if !traffic_expected() {
        // The story as without traffic, and one line saying why.
        assert_eq!(skip_lines(&stdout).len(), 1, "{stdout}");
        assert!(!stdout.contains("GET http://"), "{stdout}");
        return;
    }
    assert!(skip_lines(&stdout).is_empty(), "{stdout}");
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
