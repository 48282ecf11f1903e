//! The README's first command: `service-mirror demo` tells its whole story.

use std::process::Command;

#[test]
fn the_demo_tells_its_story() {
    let out = Command::new(env!("CARGO_BIN_EXE_service-mirror"))
        .arg("demo")
        .output()
        .expect("run service-mirror demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "every mirror gets the gateway's address",
        "web-east ",
        "metrics=4143",
        "192.0.2.11",
        "not ready",
        "reviews-north",
        "Story told in",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    assert!(!stdout.contains("did not converge"));
}
