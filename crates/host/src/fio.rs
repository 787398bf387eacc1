//! fio processes: build the command line for one job process, start it inside
//! a cgroup (before it issues any I/O), and read its JSON output.
//!
//! The JSON is read with typed structs of the few fields used, because the
//! only fio-JSON crate (`fio-results` 0.1) fails on fio 3.33's output.

use crate::error::{HostError, Result};
use serde::Deserialize;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Oldest fio whose JSON and options iofloor relies on.
pub const MIN_VERSION: (u32, u32) = (3, 16);

/// Checks that fio is installed and recent enough; returns its version.
pub fn check_version() -> Result<(u32, u32)> {
    let out =
        Command::new("fio")
            .arg("--version")
            .output()
            .map_err(|_| HostError::ToolMissing {
                program: "fio",
                package: "fio",
            })?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let v = parse_version(&text).ok_or_else(|| {
        HostError::not_usable(
            "fio --version",
            format!("cannot read a version from `{text}`"),
        )
    })?;
    if v < MIN_VERSION {
        return Err(HostError::ToolTooOld {
            program: "fio",
            found: format!("{}.{}", v.0, v.1),
            needed: format!("{}.{}", MIN_VERSION.0, MIN_VERSION.1),
        });
    }
    Ok(v)
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.strip_prefix("fio-")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// One fio process: a job with `numjobs=1`.
#[derive(Debug, Clone, PartialEq)]
pub struct FioJob {
    pub name: String,
    pub filename: PathBuf,
    pub rw: String,
    pub rwmixread: Option<u8>,
    pub bs: u64,
    pub iodepth: u32,
    /// fio `rate` (bytes/s) or `rate_iops`.
    pub rate_bytes: Option<u64>,
    pub rate_iops: Option<u64>,
    /// fio `rate_process` (`linear` when `None`, fio's default).
    pub rate_process: Option<&'static str>,
    /// Run for this long (the runner also stops it early with SIGTERM).
    pub runtime_s: f64,
    /// Where fio writes its per-I/O completion-latency log (prefix), if wanted.
    pub lat_log: Option<PathBuf>,
    /// Where fio writes its JSON result.
    pub output: PathBuf,
    /// Offset range this process may use, so processes don't share blocks.
    pub offset: u64,
    pub size: u64,
    /// Seconds of I/O before fio starts counting (fio `ramp_time`).
    pub ramp_s: Option<f64>,
}

impl FioJob {
    /// A closed-loop job over the first 64 MiB of `filename`, with no rate,
    /// no latency log and no ramp-up; callers set what differs.
    pub fn new(
        name: impl Into<String>,
        filename: &Path,
        rw: &str,
        bs: u64,
        iodepth: u32,
        runtime_s: f64,
        output: PathBuf,
    ) -> FioJob {
        FioJob {
            name: name.into(),
            filename: filename.to_path_buf(),
            rw: rw.to_string(),
            rwmixread: None,
            bs,
            iodepth,
            rate_bytes: None,
            rate_iops: None,
            rate_process: None,
            runtime_s,
            lat_log: None,
            output,
            offset: 0,
            size: 64 << 20,
            ramp_s: None,
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--name={}", self.name),
            format!("--filename={}", self.filename.display()),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--iodepth={}", self.iodepth),
            format!("--offset={}", self.offset),
            format!("--size={}", self.size),
            "--time_based".into(),
            format!("--runtime={}ms", (self.runtime_s * 1000.0).ceil() as u64),
            "--randrepeat=0".into(),
            "--norandommap".into(),
            "--output-format=json".into(),
            format!("--output={}", self.output.display()),
        ];
        if let Some(m) = self.rwmixread {
            a.push(format!("--rwmixread={m}"));
        }
        if let Some(r) = self.ramp_s {
            a.push(format!("--ramp_time={}ms", (r * 1000.0).round() as u64));
        }
        if let Some(r) = self.rate_bytes {
            a.push(format!("--rate={r}"));
        }
        if let Some(r) = self.rate_iops {
            a.push(format!("--rate_iops={r}"));
        }
        if let Some(p) = self.rate_process {
            a.push(format!("--rate_process={p}"));
        }
        if let Some(log) = &self.lat_log {
            // Every completion: (ms since start, clat ns, direction, bs, ...).
            a.push(format!("--write_lat_log={}", log.display()));
            a.push("--log_offset=0".into());
            a.push("--per_job_logs=0".into());
        }
        a
    }

    /// Runs the job to its end in the caller's cgroup and reads its result.
    pub fn run(&self) -> Result<FioOutput> {
        let out = Command::new("fio")
            .args(self.args())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| HostError::Command {
                what: "fio".into(),
                message: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(HostError::Command {
                what: format!("fio {}", self.name),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        read_output(&self.output)
    }

    /// Starts the process inside `cgroup_procs` (a cgroup's `cgroup.procs`
    /// file): the child moves itself there before exec, so every I/O it
    /// issues is charged to the cgroup.
    pub fn spawn_in(&self, cgroup_procs: &Path) -> Result<Child> {
        let path = CString::new(cgroup_procs.as_os_str().as_encoded_bytes())
            .map_err(|_| HostError::not_usable(cgroup_procs.display(), "path has a NUL byte"))?;
        let mut cmd = Command::new("fio");
        cmd.args(self.args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs between fork and exec and only makes raw
        // system calls (getpid, open, write, close) on memory prepared before
        // the fork: no allocation, no locks.
        unsafe {
            cmd.pre_exec(move || {
                let pid = rustix::process::getpid().as_raw_nonzero().get() as u64;
                let mut buf = [0u8; 20];
                let mut i = buf.len();
                let mut n = pid;
                loop {
                    i -= 1;
                    buf[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                let fd = rustix::fs::open(
                    path.as_c_str(),
                    rustix::fs::OFlags::WRONLY,
                    rustix::fs::Mode::empty(),
                )?;
                rustix::io::write(&fd, &buf[i..])?;
                Ok(())
            });
        }
        cmd.spawn().map_err(|e| HostError::Command {
            what: "fio".into(),
            message: e.to_string(),
        })
    }
}

// ---- JSON output ----

#[derive(Debug, Clone, Deserialize)]
pub struct FioOutput {
    pub jobs: Vec<FioJobResult>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FioJobResult {
    pub jobname: String,
    #[serde(default)]
    pub error: i64,
    pub read: FioDirResult,
    pub write: FioDirResult,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct FioDirResult {
    #[serde(default)]
    pub io_bytes: u64,
    #[serde(default)]
    pub total_ios: u64,
    #[serde(default)]
    pub iops: f64,
    #[serde(default)]
    pub bw_bytes: f64,
    #[serde(default)]
    pub clat_ns: FioLatency,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct FioLatency {
    #[serde(default)]
    pub mean: f64,
    #[serde(default)]
    pub percentile: std::collections::BTreeMap<String, f64>,
}

impl FioLatency {
    pub fn p99_ns(&self) -> Option<f64> {
        self.percentile.get("99.000000").copied()
    }
}

/// Reads fio's JSON output file. fio may print warnings before the JSON.
pub fn read_output(path: &Path) -> Result<FioOutput> {
    let text = std::fs::read_to_string(path).map_err(|e| HostError::io(path, e))?;
    parse_output(&text, path)
}

/// [`read_output`] on text already read; `path` names it in errors.
pub fn parse_output(text: &str, path: &Path) -> Result<FioOutput> {
    let start = text
        .find('{')
        .ok_or_else(|| HostError::malformed(path, None, "no JSON in fio output"))?;
    serde_json::from_str(&text[start..])
        .map_err(|e| HostError::malformed(path, Some(e.line()), format!("fio JSON: {e}")))
}

/// One completion from a latency log: (ms since start, latency ns, is write).
pub fn read_lat_log(path: &Path) -> Result<Vec<(u64, u64, bool)>> {
    let text = std::fs::read_to_string(path).map_err(|e| HostError::io(path, e))?;
    parse_lat_log(&text, path)
}

/// [`read_lat_log`] on text already read; `path` names it in errors.
pub fn parse_lat_log(text: &str, path: &Path) -> Result<Vec<(u64, u64, bool)>> {
    let mut out = Vec::with_capacity(text.len() / 24);
    for (n, line) in text.lines().enumerate() {
        let mut f = line.split(',').map(str::trim);
        let bad =
            || HostError::malformed(path, Some(n + 1), format!("`{line}` is not a fio log line"));
        let t: u64 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let lat: u64 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let dir: u32 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        out.push((t, lat, dir == 1));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("fio-3.33"), Some((3, 33)));
        assert_eq!(parse_version("fio-3.16-12-g1234"), Some((3, 16)));
        assert_eq!(parse_version("fio 2"), None);
    }

    #[test]
    fn reads_fio_3_33_json_with_warnings_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        std::fs::write(
            &p,
            r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version": "fio-3.33", "jobs": [{"jobname": "q", "error": 0,
 "read": {"io_bytes": 0, "total_ios": 0, "iops": 0.0, "bw_bytes": 0, "clat_ns": {"mean": 0.0}},
 "write": {"io_bytes": 6553600, "total_ios": 100, "iops": 50.5, "bw_bytes": 3276800,
   "clat_ns": {"mean": 1500000.0, "percentile": {"50.000000": 1400000, "99.000000": 6455296}}}}]}"#,
        )
        .unwrap();
        let out = read_output(&p).unwrap();
        assert_eq!(out.jobs[0].write.total_ios, 100);
        assert_eq!(out.jobs[0].write.clat_ns.p99_ns(), Some(6455296.0));
    }
}
