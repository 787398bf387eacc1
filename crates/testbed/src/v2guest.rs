//! The cgroup v2 host: a QEMU guest under TCG booting Debian's cloud kernel
//! with the v2 image of scripts/guest-image.sh (cgroup2 with `io` enabled at
//! its root, fio and its libraries, BFQ), whatever files the caller adds
//! (iofloor itself) appended as a second initramfs archive. This machine's
//! own kernel binds the io controller to cgroup v1; the guest is where
//! `io.max`, `io.stat`, `io.weight` and `io.cost` run live.
//!
//! - Its disk (`/dev/vda` in the guest) is a sparse file on tmpfs behind a
//!   QEMU throttle group: a device of known capacity, changeable live over
//!   QMP like the rig's.
//! - The host runs commands in it through a shell on a virtio-serial port
//!   (the cloud kernel has neither 9p nor a vsock the host could serve;
//!   virtio-serial needs no guest network), with output and exit status.
//! - Its port 9180 (where a daemon in it listens) is forwarded to a port
//!   on the host's loopback through QEMU's user network.
//!
//! Like the rig, a guest records what it made under a state root (default
//! `/run/iofloor/guests`) before making it, so `down` removes everything,
//! also after a crash.

use crate::rig::{down_each, new_state_dir, which, RigSpec};
use crate::rig::{
    is_ours, parse_state, qemu_value, read_pidfile, read_states, set_group_limits, stop_process,
};
use iofloor_host::error::{HostError, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const DEFAULT_STATE_ROOT: &str = "/run/iofloor/guests";
/// The port a daemon in the guest listens on; the host reaches it at
/// [`V2Guest::api_port`] on 127.0.0.1.
pub const GUEST_API_PORT: u16 = 9180;
/// The virtio-serial port over which a bench in the guest asks the host to
/// change its disk's capacity (a scenario's `device.change`), answered by
/// [`V2Guest::serve_capacity`] on the host.
pub const CAPACITY_PORT: &str = "iofloor.capacity";
/// How long a boot may take under TCG before it is given up.
const BOOT_WITHIN: Duration = Duration::from_secs(180);

/// Where scripts/guest-image.sh put the v2 image.
pub fn image_dir() -> PathBuf {
    crate::guest::image_dir().join("v2")
}

/// What a guest made, recorded as it is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct V2Guest {
    pub dir: PathBuf,
    /// The capacity of its disk.
    pub spec: RigSpec,
    /// The disk's file, on tmpfs so that the throttle group is its only
    /// limit.
    pub backing: PathBuf,
    /// QEMU's monitor (the throttle group's limits).
    pub qmp: PathBuf,
    /// The command channel's socket.
    pub commands: PathBuf,
    /// The capacity port's socket ([`CAPACITY_PORT`]).
    #[serde(default)]
    pub capacity: PathBuf,
    pub console: PathBuf,
    /// The host port forwarded to the guest's [`GUEST_API_PORT`].
    pub api_port: u16,
    pub qemu_pid: Option<u32>,
    /// The disk as the guest's kernel numbers it (`MAJ:MIN`), once booted.
    pub device: Option<String>,
    /// The guest's kernel release, once booted.
    pub kernel: Option<String>,
    /// Ports of [`HOST_ADDR`] in the guest that reach a port on the host's
    /// loopback (guest port, host port): a cluster agent in the guest
    /// reaches the host's etcd so.
    #[serde(default)]
    pub host_forwards: Vec<(u16, u16)>,
}

/// The address by which the guest reaches what the host forwards to it
/// ([`V2Guest::host_forwards`]); QEMU's user network answers for it.
pub const HOST_ADDR: &str = "10.0.2.100";

/// A command's exit status and output (stdout and stderr together).
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub status: i32,
    pub output: String,
}

impl V2Guest {
    fn save(&self) -> Result<()> {
        let path = self.dir.join("state.json");
        let text = serde_json::to_string_pretty(self).expect("guest state serialises");
        std::fs::write(&path, text).map_err(|e| HostError::io(&path, e))
    }

    /// Boots a guest under `state_root` whose disk serves `spec`, with
    /// `files` (host path, path in the guest) added, `memory_mib` of RAM;
    /// returns once its command channel answers. On any failure what was
    /// made so far is removed again.
    pub fn up(
        spec: RigSpec,
        files: &[(PathBuf, String)],
        memory_mib: u32,
        state_root: &Path,
    ) -> Result<V2Guest> {
        Self::up_forwarding(spec, files, memory_mib, state_root, &[])
    }

    /// [`V2Guest::up`], with `forwards` (guest port, host port): a
    /// connection to [`HOST_ADDR`]`:guest port` in the guest reaches
    /// `127.0.0.1:host port` on the host. Each connection runs the host's
    /// busybox `nc` (QEMU's `guestfwd` to a command): the form that takes
    /// more than one connection and one made before the host's server is up.
    pub fn up_forwarding(
        spec: RigSpec,
        files: &[(PathBuf, String)],
        memory_mib: u32,
        state_root: &Path,
        forwards: &[(u16, u16)],
    ) -> Result<V2Guest> {
        spec.validate()?;
        which("qemu-system-x86_64")?;
        which("cpio")?;
        which("strip")?;
        let base = image_dir().join("base.cpio");
        if !base.is_file() {
            return Err(HostError::not_usable(
                base.display(),
                "is missing: run scripts/guest-image.sh (scripts/deps.sh does)",
            ));
        }
        let state_root =
            &std::path::absolute(state_root).map_err(|e| HostError::io(state_root, e))?;
        std::fs::create_dir_all(state_root).map_err(|e| HostError::io(state_root, e))?;
        let dir = new_state_dir(state_root, "guest")?;
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let mut guest = V2Guest {
            backing: PathBuf::from(format!("/dev/shm/iofloor-{name}.img")),
            qmp: dir.join("qmp.sock"),
            commands: dir.join("cmd.sock"),
            capacity: dir.join("capacity.sock"),
            console: dir.join("console.log"),
            api_port: free_port()?,
            dir,
            spec,
            qemu_pid: None,
            device: None,
            kernel: None,
            host_forwards: forwards.to_vec(),
        };
        guest.save()?;
        match guest.start(&base, files, memory_mib) {
            Ok(()) => Ok(guest),
            Err(e) => {
                let _ = guest.down();
                Err(e)
            }
        }
    }

    fn start(&mut self, base: &Path, files: &[(PathBuf, String)], memory_mib: u32) -> Result<()> {
        let initrd = self.dir.join("initrd");
        write_initrd(base, files, &self.dir.join("payload"), &initrd)?;
        let backing =
            std::fs::File::create(&self.backing).map_err(|e| HostError::io(&self.backing, e))?;
        backing
            .set_len(self.spec.size)
            .map_err(|e| HostError::io(&self.backing, e))?;
        let pidfile = self.dir.join("qemu.pid");
        let mut throttle = format!("throttle-group,id=dev,x-iops-total={}", self.spec.iops);
        if let Some(b) = self.spec.bps {
            throttle += &format!(",x-bps-total={b}");
        }
        if let Some(u) = self.spec.size_unit {
            throttle += &format!(",x-iops-size={u}");
        }
        let kernel = crate::guest::image_dir().join("vmlinuz");
        crate::rig::run(
            Command::new("qemu-system-x86_64")
                .args(["-accel", "tcg", "-cpu", "max", "-smp", "2"])
                .args(["-m", &memory_mib.to_string()])
                .args(["-display", "none", "-no-reboot", "-nodefaults"])
                .arg("-kernel")
                .arg(&kernel)
                .arg("-initrd")
                .arg(&initrd)
                .args(["-append", "console=ttyS0 quiet panic=-1"])
                .arg("-serial")
                .arg(format!("file:{}", qemu_value(&self.console)))
                .arg("-qmp")
                .arg(format!("unix:{},server=on,wait=off", qemu_value(&self.qmp)))
                .args(["-object", &throttle])
                .arg("-blockdev")
                .arg(format!(
                    "driver=file,node-name=f0,filename={},aio=threads",
                    qemu_value(&self.backing)
                ))
                .args([
                    "-blockdev",
                    "driver=throttle,node-name=t0,throttle-group=dev,file=f0",
                ])
                .args(["-device", "virtio-blk-pci,drive=t0,id=disk0"])
                .arg("-chardev")
                .arg(format!(
                    "socket,id=cmd,path={},server=on,wait=off",
                    qemu_value(&self.commands)
                ))
                .args(["-device", "virtio-serial-pci,id=vser0"])
                .args([
                    "-device",
                    "virtserialport,bus=vser0.0,chardev=cmd,name=iofloor.cmd",
                ])
                .arg("-chardev")
                .arg(format!(
                    "socket,id=cap,path={},server=on,wait=off",
                    qemu_value(&self.capacity)
                ))
                .arg("-device")
                .arg(format!(
                    "virtserialport,bus=vser0.0,chardev=cap,name={CAPACITY_PORT}"
                ))
                .arg("-netdev")
                .arg(self.netdev())
                .args(["-device", "virtio-net-pci,netdev=n0"])
                .arg("-pidfile")
                .arg(&pidfile)
                .arg("-daemonize"),
        )?;
        self.qemu_pid = Some(read_pidfile(&pidfile)?);
        self.save()?;
        self.wait_ready()?;
        self.save()
    }

    /// QEMU's user network: the guest reaches nothing (`restrict=on`) but
    /// what is forwarded, its API port from the host and the host's ports
    /// it was given.
    fn netdev(&self) -> String {
        let mut netdev = format!(
            "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{}-:{GUEST_API_PORT}",
            self.api_port
        );
        for (guest, host) in &self.host_forwards {
            netdev +=
                &format!(",guestfwd=tcp:{HOST_ADDR}:{guest}-cmd:/bin/busybox nc 127.0.0.1 {host}");
        }
        netdev
    }

    /// Waits for the guest's ready line on its console: its kernel and
    /// its disk's number.
    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.console).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.starts_with("iofloor-v2guest: ready "))
            {
                let mut words = line.split_whitespace().skip(2);
                self.kernel = words.next().map(str::to_string);
                self.device = words.next().map(str::to_string);
                return Ok(());
            }
            let fail = |message: String| {
                Err(HostError::Command {
                    what: "v2 guest boot".into(),
                    message,
                })
            };
            if !self
                .qemu_pid
                .is_some_and(|p| is_ours(p, "qemu-system-x86_64", &self.dir))
            {
                return fail(format!(
                    "QEMU exited before the guest was ready; console:\n{text}"
                ));
            }
            if started.elapsed() > BOOT_WITHIN {
                return fail(format!(
                    "not ready in {} s; console:\n{text}",
                    BOOT_WITHIN.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `command` in the guest's shell (busybox `sh`), its input from
    /// /dev/null; returns its exit status and output once it ends, or an
    /// error after `timeout`. A command that starts something in the
    /// background must send that one's output to a file: the channel is
    /// the command's own output.
    pub fn exec(&self, command: &str, timeout: Duration) -> Result<Ran> {
        let io = |e| HostError::io(&self.commands, e);
        // The socket takes one client at a time; another waits its turn.
        let mut stream = UnixStream::connect(&self.commands).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let nonce = format!("{:x}", rand_nonce());
        let begin = format!("@@begin {nonce}");
        write!(
            stream,
            "echo '{begin}'; ( {command}\n) </dev/null 2>&1; echo \"@@rc=$? {nonce}\"\n"
        )
        .map_err(io)?;
        let deadline = Instant::now() + timeout;
        let mut reader = BufReader::new(stream);
        let (mut output, mut started) = (String::new(), false);
        loop {
            let mut line = String::new();
            let n = reader
                .read_line(&mut line)
                .map_err(|e| HostError::Command {
                    what: format!("guest command `{command}`"),
                    message: format!("no answer in {} s ({e})", timeout.as_secs_f64()),
                })?;
            if n == 0 {
                return Err(HostError::Command {
                    what: format!("guest command `{command}`"),
                    message: "the guest's shell hung up".into(),
                });
            }
            let line = line.trim_end_matches(['\n', '\r']);
            if !started {
                started = line == begin;
            } else if let Some((last, rc)) = line
                .rsplit_once("@@rc=")
                .and_then(|(last, r)| Some((last, r.strip_suffix(&nonce)?)))
            {
                // Output that did not end its last line (a JSON file)
                // runs into the marker.
                output.push_str(last);
                let status = rc.trim().parse().unwrap_or(-1);
                return Ok(Ran { status, output });
            } else {
                output.push_str(line);
                output.push('\n');
            }
            if Instant::now() > deadline {
                return Err(HostError::Command {
                    what: format!("guest command `{command}`"),
                    message: format!("did not end in {} s", timeout.as_secs_f64()),
                });
            }
        }
    }

    /// [`V2Guest::exec`] that must succeed: its output, or an error with it.
    pub fn run(&self, command: &str, timeout: Duration) -> Result<String> {
        let ran = self.exec(command, timeout)?;
        if ran.status == 0 {
            Ok(ran.output)
        } else {
            Err(HostError::Command {
                what: format!("guest command `{command}`"),
                message: format!("exit {}: {}", ran.status, ran.output.trim()),
            })
        }
    }

    /// Changes the disk's capacity live (QMP `qom-set` of the throttle
    /// group's limits) and records it.
    pub fn change_capacity(&mut self, spec: RigSpec) -> Result<()> {
        set_group_limits(&self.qmp, "dev", &spec)?;
        self.spec = spec;
        self.save()
    }

    /// Answers the guest's capacity port until QEMU closes it (the guest
    /// went down): `spec` gets the disk's capacity in force, `set SPEC`
    /// (a [`RigSpec`] in JSON) sets it live and gets it back, each answer
    /// one line, `ok SPEC` or `error MESSAGE`. What a bench in the guest
    /// uses to play a scenario's capacity changes on its disk.
    pub fn serve_capacity(mut self) -> Result<()> {
        let socket = self.capacity.clone();
        let io = |e| HostError::io(&socket, e);
        let stream = UnixStream::connect(&socket).map_err(io)?;
        let mut answers = stream.try_clone().map_err(io)?;
        let mut requests = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            if requests.read_until(b'\n', &mut line).map_err(io)? == 0 {
                return Ok(());
            }
            // `guest set` may have changed the disk since the last request.
            self.reload()?;
            let request = String::from_utf8_lossy(&line);
            let answer = match self.capacity_request(request.trim()) {
                Ok(spec) => format!(
                    "ok {}",
                    serde_json::to_string(&spec).expect("a spec serialises")
                ),
                Err(e) => format!("error {e}"),
            };
            writeln!(answers, "{answer}").map_err(io)?;
        }
    }

    /// This guest as its state file says now.
    fn reload(&mut self) -> Result<()> {
        let path = self.dir.join("state.json");
        let text = std::fs::read_to_string(&path).map_err(|e| HostError::io(&path, e))?;
        *self = parse_state(&path, &text)?;
        Ok(())
    }

    fn capacity_request(&mut self, request: &str) -> Result<RigSpec> {
        match request.split_once(' ').unwrap_or((request, "")) {
            ("spec", "") => Ok(self.spec),
            ("set", json) => {
                let spec: RigSpec = serde_json::from_str(json).map_err(|e| {
                    HostError::malformed(&self.capacity, None, format!("`{json}`: {e}"))
                })?;
                self.change_capacity(spec)?;
                Ok(spec)
            }
            _ => Err(HostError::malformed(
                &self.capacity,
                None,
                format!("`{request}` is neither `spec` nor `set SPEC`"),
            )),
        }
    }

    /// Stops QEMU (ours only, by its recorded PID) and removes the disk and
    /// the state; tolerates parts already gone.
    pub fn down(&self) -> Result<()> {
        stop_process(self.qemu_pid, "qemu-system-x86_64", &self.dir);
        match std::fs::remove_file(&self.backing) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HostError::io(&self.backing, e)),
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(HostError::io(&self.dir, e)),
        }
    }

    /// Every guest recorded under `state_root`.
    pub fn list(state_root: &Path) -> Result<Vec<V2Guest>> {
        read_states(state_root)
    }

    /// Removes every guest under `state_root`; returns how many.
    pub fn down_all(state_root: &Path) -> Result<usize> {
        down_each(&V2Guest::list(state_root)?, V2Guest::down)
    }
}

/// The guest's initramfs: the image's base archive and, after it, one of
/// `files` (programs stripped of their debug information),
/// which the kernel unpacks over the first.
fn write_initrd(
    base: &Path,
    files: &[(PathBuf, String)],
    stage: &Path,
    initrd: &Path,
) -> Result<()> {
    for (from, to) in files {
        let target = stage.join(to.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| HostError::io(parent, e))?;
        }
        if is_elf(from) {
            // The test binaries carry hundreds of MB of debug information
            // the guest's RAM need not hold.
            crate::rig::run(
                Command::new("strip")
                    .arg("--strip-debug")
                    .arg("-o")
                    .arg(&target)
                    .arg(from),
            )?;
        } else {
            std::fs::copy(from, &target).map_err(|e| HostError::io(from, e))?;
        }
    }
    std::fs::copy(base, initrd).map_err(|e| HostError::io(initrd, e))?;
    let payload = crate::rig::run(Command::new("sh").arg("-c").arg(format!(
        "cd '{}' && find . | cpio -o -H newc --quiet >> '{}'",
        stage.display(),
        initrd.display()
    )));
    payload.map(|_| ())
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

/// A port on the host's loopback nobody listens on now.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| HostError::io(Path::new("127.0.0.1:0"), e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| HostError::io(Path::new("127.0.0.1:0"), e))
}

/// A value that tells one command's end marker from any other's.
fn rand_nonce() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    nanos ^ (u128::from(std::process::id()) << 64)
}

/// The guest's side of [`CAPACITY_PORT`]: its disk's capacity, asked of
/// and set by the host. Found only inside the test guest.
#[derive(Debug, Clone)]
pub struct GuestDisk {
    port: PathBuf,
    /// The capacity when it was found.
    pub spec: RigSpec,
}

/// How long the host's relay has to answer.
const CAPACITY_ANSWER_WITHIN: Duration = Duration::from_secs(10);

impl GuestDisk {
    /// The capacity port of the guest this runs in, and its disk's
    /// capacity; `None` outside the guest. An error if the port is there
    /// but the host does not answer.
    pub fn find(sys: &Path) -> Result<Option<GuestDisk>> {
        let ports = sys.join("class/virtio-ports");
        let Ok(entries) = std::fs::read_dir(&ports) else {
            return Ok(None);
        };
        for entry in entries.flatten() {
            let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
            if name.trim() == CAPACITY_PORT {
                let port = Path::new("/dev").join(entry.file_name());
                let spec = ask(&port, "spec")?;
                return Ok(Some(GuestDisk { port, spec }));
            }
        }
        Ok(None)
    }

    /// Sets the disk's capacity live, through the host.
    pub fn set_limits(&self, spec: &RigSpec) -> Result<()> {
        let json = serde_json::to_string(spec).expect("a spec serialises");
        ask(&self.port, &format!("set {json}")).map(|_| ())
    }
}

/// One request on the capacity port and its answer, within
/// [`CAPACITY_ANSWER_WITHIN`]. The port is opened non-blocking: with no one
/// on the host's end a write would wait for ever, and a relay that goes
/// away mid-answer shows as a hang-up, not as a read that never ends.
fn ask(port: &Path, request: &str) -> Result<RigSpec> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| HostError::io(port, e);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(port)
        .map_err(io)?;
    let waiting = PortWait {
        port,
        request,
        deadline: Instant::now() + CAPACITY_ANSWER_WITHIN,
    };
    let line = format!("{request}\n");
    let mut written = 0;
    while written < line.len() {
        waiting.until(&file, rustix::event::PollFlags::OUT)?;
        match file.write(&line.as_bytes()[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io(e)),
        }
    }
    let mut answer = Vec::new();
    while !answer.ends_with(b"\n") {
        waiting.until(&file, rustix::event::PollFlags::IN)?;
        let mut chunk = [0u8; 512];
        match file.read(&mut chunk) {
            Ok(0) => return Err(waiting.gone()),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io(e)),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    match answer.trim().split_once(' ') {
        Some(("ok", json)) => serde_json::from_str(json)
            .map_err(|e| HostError::malformed(port, None, format!("`{json}`: {e}"))),
        _ => Err(HostError::Command {
            what: format!("`{request}` on {}", port.display()),
            message: answer.trim().to_string(),
        }),
    }
}

/// One request's wait on the capacity port: its deadline, and the errors
/// that name the port and the request.
struct PortWait<'a> {
    port: &'a Path,
    request: &'a str,
    deadline: Instant,
}

impl PortWait<'_> {
    /// Waits until the port is ready for `flags`; an error at the deadline
    /// or when the host's end has gone (a hang-up with nothing to read).
    fn until(&self, file: &std::fs::File, flags: rustix::event::PollFlags) -> Result<()> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        use std::os::fd::AsFd;
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec::try_from(left).unwrap_or_default();
        let fd = file.as_fd();
        let mut fds = [PollFd::new(&fd, flags)];
        let ready =
            poll(&mut fds, Some(&timeout)).map_err(|e| HostError::io(self.port, e.into()))?;
        let events = fds[0].revents();
        if ready == 0 || left.is_zero() {
            return Err(HostError::Timeout {
                what: format!(
                    "an answer to `{}` from the host's capacity relay on {}",
                    self.request,
                    self.port.display()
                ),
                secs: CAPACITY_ANSWER_WITHIN.as_secs(),
            });
        }
        if events.intersects(PollFlags::HUP | PollFlags::ERR) && !events.contains(PollFlags::IN) {
            return Err(self.gone());
        }
        Ok(())
    }

    fn gone(&self) -> HostError {
        HostError::Command {
            what: format!("`{}` on {}", self.request, self.port.display()),
            message:
                "no relay on the host's end (`iofloor guest up` starts one: `iofloor guest relay`)"
                    .into(),
        }
    }
}
