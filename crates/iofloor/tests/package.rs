//! The Debian package (`scripts/package-deb.sh`), as an operator meets it:
//! built, installed with `apt-get install ./iofloor_VERSION_ARCH.deb`, its
//! shipped config checked and run, its unit verified, an operator's config
//! kept (made before the package, or edited and installed again), and
//! nothing left after a purge. It
//! packages the binary the tests built (the release build differs only in
//! optimisation). Needs root, dpkg and apt (every Debian), objdump and
//! systemd-analyze (scripts/deps.sh installs them); fails loudly without.

mod common;

use common::bin;
use iofloor_testbed::needs::{require, Need};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CONFIG: &str = "/etc/iofloor/iofloor.toml";

/// Every path the package makes, beside dpkg's own records.
const MADE: &[&str] = &[
    "/usr/bin/iofloor",
    "/lib/systemd/system/iofloor.service",
    "/etc/iofloor",
    "/var/lib/iofloor",
    "/usr/share/doc/iofloor",
    "/usr/share/iofloor",
    "/etc/systemd/system/multi-user.target.wants/iofloor.service",
    "/var/lib/systemd/deb-systemd-helper-enabled/iofloor.service.dsh-also",
    "/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/iofloor.service",
];

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

#[track_caller]
fn run_ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${Status}", "iofloor"])
        .stdout
        .starts_with(b"install ok installed")
}

/// Purges the package when the test ends, also when it fails half way.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "iofloor"]);
    }
}

#[test]
fn the_package_installs_runs_keeps_an_edited_config_and_purges_clean() {
    let needs = [
        Need::Root,
        Need::Program("dpkg-deb"),
        Need::Program("apt-get"),
        Need::Program("objdump"),
        Need::Program("systemd-analyze"),
    ];
    if !require("the Debian package test", &needs) {
        return;
    }
    // An operator's own install is not ours to replace.
    assert!(
        !installed(),
        "an iofloor package is installed on this machine; the test would replace it"
    );
    let out = tempfile::tempdir().unwrap();
    let deb = build(out.path());
    let _purge = Purge;
    an_existing_config_is_kept(&deb);

    run_ok("apt-get", &["install", "-y", deb.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(CONFIG).unwrap(),
        std::fs::read_to_string("/usr/share/iofloor/iofloor.toml").unwrap()
    );
    assert!(installed());
    let token = std::fs::read_to_string("/etc/iofloor/token").unwrap();
    assert_eq!(token.trim().len(), 64, "a 32-byte token in hex: {token}");
    let mode = std::fs::metadata("/etc/iofloor/token")
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    for path in MADE {
        assert!(Path::new(path).exists(), "{path} after install");
    }
    let unit = std::fs::read_to_string("/lib/systemd/system/iofloor.service").unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/iofloor run --config /etc/iofloor/iofloor.toml"),
        "{unit}"
    );

    let check = run_ok("/usr/bin/iofloor", &["run", "--check", "--config", CONFIG]);
    assert!(
        check.contains("ok (0 devices") && check.contains("no [[device]] is configured"),
        "{check}"
    );
    run_ok(
        "systemd-analyze",
        &["verify", "/lib/systemd/system/iofloor.service"],
    );
    the_shipped_config_runs_and_stops_clean();

    // Installed again over an edited config: the edit and the token stay.
    let edited = format!(
        "{}\n# edited by the operator\n",
        std::fs::read_to_string(CONFIG).unwrap()
    );
    std::fs::write(CONFIG, &edited).unwrap();
    run_ok(
        "apt-get",
        &["install", "-y", "--reinstall", deb.to_str().unwrap()],
    );
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), edited);
    assert_eq!(
        std::fs::read_to_string("/etc/iofloor/token").unwrap(),
        token
    );

    purged_clean();
}

#[track_caller]
fn purged_clean() {
    run_ok("apt-get", &["purge", "-y", "iofloor"]);
    assert!(!installed());
    let left: Vec<&&str> = MADE.iter().filter(|p| Path::new(p).exists()).collect();
    assert!(left.is_empty(), "left after purge: {left:?}");
}

/// A config made before the package (a source install) and its token stay
/// as they are through a non-interactive install, which says so; a purge
/// then removes them too.
fn an_existing_config_is_kept(deb: &Path) {
    let mine = "# made before the package\ninterval = \"2s\"\n";
    std::fs::create_dir_all("/etc/iofloor").unwrap();
    std::fs::write(CONFIG, mine).unwrap();
    std::fs::write("/etc/iofloor/token", "mine\n").unwrap();
    let said = run_ok("apt-get", &["install", "-y", deb.to_str().unwrap()]);
    assert!(said.contains("keeping /etc/iofloor/iofloor.toml"), "{said}");
    assert_eq!(std::fs::read_to_string(CONFIG).unwrap(), mine);
    assert_eq!(
        std::fs::read_to_string("/etc/iofloor/token").unwrap(),
        "mine\n"
    );
    purged_clean();
}

/// `scripts/package-deb.sh` on the binary the tests built; the package's
/// contents as listed by dpkg-deb.
fn build(out: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/package-deb.sh");
    let built = run_ok(
        script.to_str().unwrap(),
        &["--binary", bin(), "--out", out.to_str().unwrap()],
    );
    let deb = PathBuf::from(built.trim());
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("iofloor_{}_", env!("CARGO_PKG_VERSION")))
            && name.ends_with(".deb"),
        "{name}"
    );
    let deb_path = deb.to_str().unwrap();
    let contents = run_ok("dpkg-deb", &["--contents", deb_path]);
    for path in [
        "./usr/bin/iofloor",
        "./lib/systemd/system/iofloor.service",
        "./usr/share/iofloor/iofloor.toml",
        "./usr/share/doc/iofloor/copyright",
        "./usr/share/doc/iofloor/config.md",
    ] {
        assert!(
            contents.contains(path),
            "{path} not in the package: {contents}"
        );
    }
    // No conffile: the postinst copies the config where none is (a
    // conffile meeting an existing config stops `apt-get -y` at a prompt).
    assert!(!contents.contains("./etc/"), "{contents}");
    // Nothing but the package is left in the output directory.
    let entries: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, vec![name]);
    deb
}

/// The installed service on the shipped config: it starts, answers its API
/// with no tenant, and stops on SIGTERM with its state file removed.
fn the_shipped_config_runs_and_stops_clean() {
    let mut daemon = Command::new("/usr/bin/iofloor")
        .args(["run", "--config", CONFIG])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(body) = get("127.0.0.1:9180", "/api/v1/tenants") {
            break body;
        }
        if Instant::now() > deadline || daemon.try_wait().unwrap().is_some() {
            let _ = daemon.kill();
            let err = stderr_of(&mut daemon);
            panic!("the packaged service did not answer on 127.0.0.1:9180: {err}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let tenants: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(tenants["tenants"], serde_json::json!([]), "{status}");
    Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status()
        .unwrap();
    let exit = daemon.wait().unwrap();
    let err = stderr_of(&mut daemon);
    assert!(exit.success(), "{exit}: {err}");
    assert!(err.contains("no [[device]] is configured"), "{err}");
    for left in ["/run/iofloor/state.json", "/run/iofloor/api.sock"] {
        assert!(!Path::new(left).exists(), "{left} left by the service");
    }
}

/// What a finished (or killed) child wrote to its piped stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut err);
    }
    err
}

/// The body of a 200 answer to `GET path`, or None while nothing answers.
fn get(addr: &str, path: &str) -> Option<String> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?;
    (status == "200").then(|| body.to_string())
}
