//! Threads and runtimes: the worker runtimes that own client sessions, the control thread
//! (health checks, admin API, signals), listener sockets, and graceful shutdown.

use std::net::SocketAddr;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;

use crate::config::{Address, RuntimeFlavor, parse_address};
use crate::control::upgrade::{self, Inherited, Listening, UpgradeError};
use crate::ctx::Ctx;
use crate::frontend::{self, Listener};
use crate::net::{Stream, tune_tcp};

/// Why sluice could not start (or take over from the process it upgrades).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration asks for what cannot be (the fault of whoever wrote it).
    #[error(transparent)]
    Invalid(#[from] crate::config::InvalidValue),
    /// Binding a listener, or starting a thread or runtime, failed (the host's).
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// Keeping the sockets for a later upgrade, or taking them from an earlier one, failed.
    #[error(transparent)]
    Upgrade(#[from] UpgradeError),
}

/// An I/O error on the way, named.
fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}
/// A listener's sockets and what sessions need to know of it.
type Bound = (Sock, Arc<Listener>);

/// A bound listener: one TCP socket per worker (SO_REUSEPORT), or one Unix socket shared by all.
enum Sock {
    Tcp(Vec<std::net::TcpListener>, SocketAddr),
    Unix(StdUnixListener, PathBuf),
}

fn bind_tcp(addr: SocketAddr, count: usize) -> std::io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let mut out = Vec::with_capacity(count);
    let mut actual = addr;
    for _ in 0..count.max(1) {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        tune_tcp(socket2::SockRef::from(&s));
        s.bind(&actual.into())?;
        s.listen(1024)?;
        let l: std::net::TcpListener = s.into();
        actual = l.local_addr()?;
        out.push(l);
    }
    Ok((out, actual))
}

fn bind_unix(path: &PathBuf) -> std::io::Result<StdUnixListener> {
    if path.exists() {
        // A socket file nobody listens on is left over from a previous run.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "another process listens on this socket"));
        }
        std::fs::remove_file(path)?;
    }
    let l = StdUnixListener::bind(path)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Runs sluice until a graceful shutdown completes. `inherited`: the sockets an old process
/// handed over (an upgrade, `upgrade.rs`), used instead of binding new ones.
pub fn run(ctx: Arc<Ctx>, mut inherited: Option<Inherited>) -> Result<(), StartError> {
    let workers = ctx.config().workers();
    let flavor = ctx.config().proxy.runtime;
    let per_socket = if flavor == RuntimeFlavor::PerCore { workers } else { 1 };
    let mut listening = Listening::new();
    if let Some(first) = inherited.as_ref().map(Inherited::next_session_id).filter(|&n| n != 0) {
        ctx.sessions.start_ids_at(first);
    }
    let (bound, names) = listen(&ctx, per_socket, inherited.as_mut(), &mut listening)?;
    let config = ctx.config();
    let admin = admin_listener(config.admin.listen.as_ref(), "admin.listen", upgrade::ADMIN, inherited.as_mut(), &mut listening)?;
    let sql_admin =
        admin_listener(config.admin.sql_listen.as_ref(), "admin.sql_listen", upgrade::SQL_ADMIN, inherited.as_mut(), &mut listening)?;
    drop(config);
    if let Some(l) = &sql_admin {
        tracing::info!(address = %l.local_addr().map_err(io("admin.sql_listen"))?, "SQL admin listener");
    }
    let admin_name = admin.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string()).unwrap_or_else(|| "none".into());
    refuse_loops(&ctx, &bound, [&admin, &sql_admin])?;
    for (l, _) in &bound {
        if let Sock::Tcp(_, a) = l
            && !a.ip().is_loopback()
        {
            tracing::warn!(address = %a, "listening on a non-loopback address");
        }
    }

    ctx.tls.log_in_use("using a");
    let (stop_tx, stop_rx) = watch::channel(false);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let me = crate::control::cluster::Instance {
        name: ctx
            .config()
            .cluster
            .name
            .clone()
            .unwrap_or_else(|| if admin_name == "none" { format!("pid-{}", std::process::id()) } else { admin_name.clone() }),
        admin: admin_name.clone(),
        listeners: names.clone(),
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_at_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
    };
    spawn_control(ctx.clone(), [admin, sql_admin], Arc::new(listening), me, stop_tx, done_tx)?;
    let runtimes = match flavor {
        RuntimeFlavor::PerCore => spawn_per_core(&ctx, bound, workers, stop_rx)?,
        RuntimeFlavor::Multi => spawn_multi(&ctx, bound, workers, stop_rx)?,
    };
    let joined = names.join(",");
    tracing::info!(listeners = ?joined, admin = ?admin_name, workers, runtime = ?flavor, pid = std::process::id(), "sluice ready");
    if let Some(i) = inherited {
        tracing::info!("upgrade: accepting on the sockets handed over; the old process stops accepting and hands its sessions over");
        adopt_sessions(ctx.clone(), i.ready(), runtimes)?;
    }
    let _ = done_rx.recv();
    tracing::info!("shutdown complete");
    Ok(())
}

/// An admin listener (`key` names its setting, `name` its sockets in a hand-over): handed over
/// by an old process, else bound; kept in `listening`.
fn admin_listener(
    address: Option<&toml::Spanned<String>>,
    key: &str,
    name: &str,
    inherited: Option<&mut Inherited>,
    listening: &mut Listening,
) -> Result<Option<std::net::TcpListener>, StartError> {
    let Some(a) = address else { return Ok(None) };
    let Address::Tcp(addr) = parse_address(a.get_ref())? else {
        return Err(crate::config::InvalidValue(format!("{key} must be HOST:PORT")).into());
    };
    let l = match inherited.and_then(|i| i.take(name).pop()) {
        Some(fd) => std::net::TcpListener::from(fd),
        None => std::net::TcpListener::bind(addr).map_err(io(format!("{key} on {addr}")))?,
    };
    l.set_nonblocking(true).map_err(io(key))?;
    listening.keep(name, &l)?;
    if !addr.ip().is_loopback() {
        tracing::warn!(address = %addr, "{key} is not a loopback address");
    }
    Ok(Some(l))
}

/// The sockets of every configured listener: handed over by an old process, else bound (TCP:
/// `per_socket` SO_REUSEPORT sockets, the missing ones bound beside those handed over). Each is
/// also kept in `listening`, to hand over in turn.
fn listen(
    ctx: &Ctx,
    per_socket: usize,
    mut inherited: Option<&mut Inherited>,
    listening: &mut Listening,
) -> Result<(Vec<Bound>, Vec<String>), StartError> {
    let (mut bound, mut names) = (Vec::new(), Vec::new());
    let config = ctx.config();
    for l in &config.listeners {
        let name = l.address.get_ref().clone();
        let auth = config.auth_mode(l);
        let multiplex = l.multiplex.unwrap_or(config.proxy.multiplex);
        let proxy_from = l.proxy_protocol.iter().filter_map(|n| crate::config::Network::parse(n.get_ref()).ok()).collect();
        let info = Arc::new(Listener { name: name.as_str().into(), auth, multiplex, proxy_from });
        let given = inherited.as_mut().map(|i| i.take(&name)).unwrap_or_default();
        match parse_address(&name)? {
            Address::Tcp(a) => {
                let mut socks: Vec<std::net::TcpListener> = given.into_iter().map(std::net::TcpListener::from).collect();
                let at = match socks.first() {
                    Some(s) => s.local_addr().map_err(io(format!("listen on {a}")))?,
                    None => a,
                };
                if socks.len() < per_socket {
                    let (more, actual) = bind_tcp(at, per_socket - socks.len()).map_err(io(format!("listen on {a}")))?;
                    socks.extend(more);
                    names.push(actual.to_string());
                } else {
                    names.push(at.to_string());
                }
                for s in &socks {
                    listening.keep(&name, s)?;
                }
                let actual = socks[0].local_addr().map_err(io(format!("listen on {a}")))?;
                bound.push((Sock::Tcp(socks, actual), info));
            }
            Address::Unix(p) => {
                let l = match given.into_iter().next() {
                    Some(fd) => StdUnixListener::from(fd),
                    None => bind_unix(&p).map_err(io(format!("listen on {}", p.display())))?,
                };
                l.set_nonblocking(true).map_err(io(format!("listen on {}", p.display())))?;
                listening.keep(&name, &l)?;
                names.push(p.display().to_string());
                bound.push((Sock::Unix(l, p), info));
            }
        }
    }
    Ok((bound, names))
}

/// Takes over the sessions the old process hands over on `channel` (an upgrade), each in a
/// worker runtime, in turn.
fn adopt_sessions(ctx: Arc<Ctx>, channel: std::os::unix::net::UnixStream, runtimes: Vec<tokio::runtime::Handle>) -> Result<(), StartError> {
    if runtimes.is_empty() {
        return Err(crate::config::InvalidValue("no worker runtime to take sessions over".into()).into());
    }
    std::thread::Builder::new()
        .name("sluice-adopt".into())
        .spawn(move || {
            let mut next = 0;
            upgrade::receive_sessions(channel, |text, fds| {
                next = (next + 1) % runtimes.len();
                runtimes[next].spawn(frontend::handoff::adopt(ctx.clone(), text, fds));
            });
        })
        .map(drop)
        .map_err(io("starting the thread that adopts sessions"))
}

/// Starts a runtime per worker, each serving its share of the sockets; their handles.
fn spawn_per_core(
    ctx: &Arc<Ctx>,
    bound: Vec<Bound>,
    workers: usize,
    stop: watch::Receiver<bool>,
) -> Result<Vec<tokio::runtime::Handle>, StartError> {
    // Hand each worker its own TCP socket and a duplicate of every Unix socket.
    let mut per_worker: Vec<Vec<Bound>> = (0..workers).map(|_| Vec::new()).collect();
    for (b, info) in bound {
        match b {
            Sock::Tcp(socks, a) => {
                for (i, s) in socks.into_iter().enumerate() {
                    per_worker[i % workers].push((Sock::Tcp(vec![s], a), info.clone()));
                }
            }
            Sock::Unix(l, p) => {
                for w in per_worker.iter_mut() {
                    let dup = l.try_clone().map_err(io("a listening socket"))?;
                    w.push((Sock::Unix(dup, p.clone()), info.clone()));
                }
            }
        }
    }
    let (handles_tx, handles) = std::sync::mpsc::channel();
    for (i, mine) in per_worker.into_iter().enumerate() {
        let ctx = ctx.clone();
        let stop = stop.clone();
        let handles_tx = handles_tx.clone();
        std::thread::Builder::new()
            .name(format!("sluice-w{i}"))
            .spawn(move || {
                crate::worker::enter(i + 1);
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start worker runtime");
                        return;
                    }
                };
                let _ = handles_tx.send(rt.handle().clone());
                drop(handles_tx);
                rt.block_on(accept_forever(ctx, mine, stop));
            })
            .map_err(io("starting a worker"))?;
    }
    drop(handles_tx);
    Ok(handles.iter().collect())
}

fn spawn_multi(
    ctx: &Arc<Ctx>,
    bound: Vec<Bound>,
    workers: usize,
    stop: watch::Receiver<bool>,
) -> Result<Vec<tokio::runtime::Handle>, StartError> {
    let next_shard = std::sync::atomic::AtomicUsize::new(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("sluice-w")
        .on_thread_start(move || crate::worker::enter_shared(next_shard.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
        .enable_all()
        .build()
        .map_err(io("starting a worker"))?;
    let ctx = ctx.clone();
    let handle = rt.handle().clone();
    std::thread::Builder::new()
        .name("sluice-rt".into())
        .spawn(move || {
            rt.block_on(accept_forever(ctx, bound, stop));
        })
        .map_err(io("starting a worker"))?;
    Ok(vec![handle])
}

/// Runs the accept loops of `bound` on the current runtime; sessions run until the process ends.
async fn accept_forever(ctx: Arc<Ctx>, bound: Vec<Bound>, stop: watch::Receiver<bool>) {
    for (b, info) in bound {
        start_accept(ctx.clone(), b, info, stop.clone());
    }
    sweep_pool(&ctx).await
}

/// Closes this worker's pooled and spare backend connections that idled out, and all of them
/// when their backend is down (spare ones also when it drains) or sluice is draining, at each
/// ring of [`ring_pool_sweeps`]. A timer of its own would sit in the worker's timer wheel, and a
/// wheel that holds one makes every park of the worker read the clock twice (5% of the
/// instructions of a point select); with none, a worker's runtime holds no timer while its
/// sessions only relay.
async fn sweep_pool(ctx: &Ctx) {
    loop {
        ctx.pool_sweeps.notified().await;
        let all = ctx.is_draining();
        for b in ctx.backends.list().iter() {
            for idle in b.expired(all) {
                crate::backend::conn::quit(idle.conn).await;
            }
            for spare in b.shared.expired(all || !b.is_usable()) {
                crate::backend::conn::quit(spare.conn).await;
            }
        }
    }
}

/// Rings the workers' pool sweeps ([`sweep_pool`]) every tick: a quarter of
/// `pool_idle_timeout`, from 100 ms to 1 s (a sweep busy at a ring waits for the next one).
async fn ring_pool_sweeps(ctx: &Ctx) {
    let timeout = ctx.config().proxy.pool_idle_timeout;
    let tick =
        (if timeout.is_zero() { Duration::from_secs(60) } else { timeout } / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        ctx.pool_sweeps.notify_waiters();
    }
}

/// Notes sluice's own listening addresses, and refuses to start when a backend is one of them
/// (every login would connect to sluice again, without end).
fn refuse_loops(ctx: &Ctx, bound: &[Bound], admin: [&Option<std::net::TcpListener>; 2]) -> Result<(), StartError> {
    let mut tcp: Vec<std::net::SocketAddr> =
        bound.iter().filter_map(|(l, _)| if let Sock::Tcp(_, a) = l { Some(*a) } else { None }).collect();
    tcp.extend(admin.iter().filter_map(|l| l.as_ref()?.local_addr().ok()));
    let unix = bound.iter().filter_map(|(l, _)| if let Sock::Unix(_, p) = l { Some(p.clone()) } else { None }).collect();
    ctx.own.set_listening(tcp, unix);
    for b in ctx.backends.list().iter() {
        if ctx.own.is_listener(&b.address) {
            let msg = format!("backend {} at {} is sluice's own listener: every login would connect to sluice again", b.name, b.address);
            return Err(crate::config::InvalidValue(msg).into());
        }
    }
    Ok(())
}

/// Starts accept loops on the current runtime for a bound listener.
fn start_accept(ctx: Arc<Ctx>, b: Sock, info: Arc<Listener>, stop: watch::Receiver<bool>) {
    match b {
        Sock::Tcp(socks, _) => {
            for s in socks {
                match tokio::net::TcpListener::from_std(s) {
                    Ok(l) => spawn_accept(ctx.clone(), Acceptor::Tcp(l), info.clone(), stop.clone()),
                    Err(e) => tracing::error!(error = %e, "listener"),
                }
            }
        }
        Sock::Unix(s, path) => match tokio::net::UnixListener::from_std(s) {
            Ok(l) => spawn_accept(ctx, Acceptor::Unix(l, format!("unix:{}", path.display())), info, stop),
            Err(e) => tracing::error!(error = %e, "listener"),
        },
    }
}

/// A listening socket an accept loop takes clients from.
enum Acceptor {
    Tcp(tokio::net::TcpListener),
    /// With the name its clients are known by (the socket's path).
    Unix(tokio::net::UnixListener, String),
}

impl Acceptor {
    /// The next client and its name.
    async fn accept(&self) -> std::io::Result<(Stream, String)> {
        match self {
            // TCP_NODELAY and keepalive come from the listener.
            Acceptor::Tcp(l) => l.accept().await.map(|(s, peer)| (Stream::Tcp(s), peer.to_string())),
            Acceptor::Unix(l, name) => l.accept().await.map(|(s, _)| (Stream::Unix(s), name.clone())),
        }
    }
}

/// Accepts clients until `stop` changes, each served by a task of its own; failed accepts
/// (out of descriptors) back off and are counted.
fn spawn_accept(ctx: Arc<Ctx>, l: Acceptor, info: Arc<Listener>, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut backoff = crate::net::AcceptBackoff::default();
        loop {
            tokio::select! {
                r = l.accept() => match r {
                    Ok((s, peer)) => {
                        backoff.succeeded();
                        tokio::spawn(frontend::serve(ctx.clone(), s, peer, info.clone()));
                    }
                    Err(e) => backoff.failed(&e, &ctx.metrics.accept_errors).await,
                },
                _ = stop.changed() => return,
            }
        }
    });
}

fn spawn_control(
    ctx: Arc<Ctx>,
    [admin, sql_admin]: [Option<std::net::TcpListener>; 2],
    listening: Arc<Listening>,
    me: crate::control::cluster::Instance,
    stop_tx: watch::Sender<bool>,
    done_tx: std::sync::mpsc::Sender<()>,
) -> Result<(), StartError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("the control thread's runtime"))?;
    let (over_tx, _) = watch::channel(false);
    std::thread::Builder::new()
        .name("sluice-control".into())
        .spawn(move || {
            rt.block_on(async move {
                crate::backend::health::spawn(&ctx.backends.list(), &ctx.config);
                tokio::spawn(return_memory(ctx.clone()));
                for (index, rx) in ctx.mirrors.take_receivers() {
                    let c = ctx.clone();
                    tokio::spawn(async move { crate::backend::mirror::run(&c.backends, index, rx, &c.mirrors.counts).await });
                }
                let c = ctx.clone();
                tokio::spawn(async move { crate::session::deadline::sweep(&c.clock, &c.sessions).await });
                let c = ctx.clone();
                tokio::spawn(async move { crate::frontend::idle::sweep(&c.sessions).await });
                let c = ctx.clone();
                tokio::spawn(async move { ring_pool_sweeps(&c).await });
                let c = ctx.clone();
                tokio::spawn(async move { crate::net::tls::keep_renewed(&c.tls).await });
                let c = ctx.clone();
                tokio::spawn(async move { crate::net::tls::watch_files(&c.tls, &c.config).await });
                let c = ctx.clone();
                tokio::spawn(async move { crate::control::rebalance::run(&c).await });
                let c = ctx.clone();
                tokio::spawn(async move { crate::control::failover::run(&c).await });
                if let Some(l) = sql_admin.and_then(|l| tokio::net::TcpListener::from_std(l).ok()) {
                    let (c, mut stop) = (ctx.clone(), over_tx.subscribe());
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = crate::control::sqladmin::serve(c, l) => {}
                            _ = stop.changed() => {}
                        }
                    });
                }
                if !ctx.config().cluster.etcd.is_empty() {
                    tokio::spawn(crate::control::cluster::run(ctx.clone(), me));
                }
                if let Some(l) = admin {
                    match tokio::net::TcpListener::from_std(l) {
                        Ok(l) => {
                            // (It stops when the sockets are handed over to a new process; while
                            // draining it goes on, to say so.)
                            let mut stop = over_tx.subscribe();
                            let stopped = async move {
                                let _ = stop.changed().await;
                            };
                            tokio::spawn(crate::control::admin::serve(ctx.clone(), l, stopped));
                        }
                        Err(e) => tracing::error!(error = %e, "admin listener"),
                    }
                }
                control_loop(&ctx, listening, [&stop_tx, &over_tx]).await;
                drain(&ctx, &stop_tx).await;
                let _ = done_tx.send(());
            });
        })
        .map_err(io("starting a worker"))?;
    Ok(())
}

/// Gives memory freed by closed connections, and by the tasks of sessions that parked, back to
/// the system. The allocator keeps freed small blocks for reuse, so after a burst of thousands
/// of connections the process would stay at its peak size; when the sessions that hold a full
/// task (connections not parked) fell well below their recent peak, the heap is trimmed.
async fn return_memory(ctx: Arc<Ctx>) {
    let mut peak = 0usize;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let parked = usize::try_from(ctx.metrics.parked_sessions.get()).unwrap_or(0);
        let now = ctx.connections.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(parked);
        peak = peak.max(now);
        if peak >= now + 64 && now <= peak / 2 {
            crate::sys::process::trim_heap();
            peak = now;
        }
    }
}

/// Runs until SIGTERM or SIGINT, or, once an upgrade handed the sockets over, until the last
/// session ended. Meanwhile SIGHUP reloads the configuration (`crate::control::reload`), and SIGUSR2 or
/// `POST /upgrade` upgrades (`crate::control::upgrade`).
/// `stop`: the accept loops' stop, and the admin listeners' (which stop only once handed over).
async fn control_loop(ctx: &Arc<Ctx>, listening: Arc<Listening>, stop: [&watch::Sender<bool>; 2]) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup), Ok(mut usr2)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
        signal(SignalKind::user_defined2()),
    ) else {
        return std::future::pending().await;
    };
    let mut asks = ctx.upgrades.take_receiver();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    // (After a hand-over, a moment for the admin API to answer the request that asked for it.)
    let mut linger = None;
    loop {
        let handed_over = ctx.handed_over();
        tokio::select! {
            _ = term.recv() => return tracing::info!("SIGTERM: draining"),
            _ = int.recv() => return tracing::info!("SIGINT: draining"),
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration");
                if let Err(refused) = crate::control::reload::reload(ctx) {
                    tracing::warn!(errors = %refused, "configuration reload refused; the configuration in force stays");
                }
            }
            _ = usr2.recv() => {
                tracing::info!("SIGUSR2: upgrading");
                let _ = upgrade(ctx, &listening, stop).await;
            }
            Some(reply) = async { match asks.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                let _ = reply.send(upgrade(ctx, &listening, stop).await);
            }
            _ = tick.tick(), if handed_over => {
                // Sessions go to the new process at their next wait for a command: the idle
                // ones (parked too) are woken to go.
                ctx.sessions.for_each(|h| h.wake.notify());
                let since = *linger.get_or_insert_with(Instant::now);
                if ctx.sessions.is_empty() && since.elapsed() >= Duration::from_secs(1) {
                    return tracing::info!("upgrade: the last session of the old process ended");
                }
                let after = ctx.config().proxy.upgrade_drain_after;
                if !after.is_zero() && since.elapsed() >= after && !ctx.is_draining() {
                    tracing::info!(sessions = ctx.sessions.len(), "upgrade: upgrade_drain_after passed; the sessions left end at their next transaction boundary");
                    ctx.draining.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    }
}

/// Starts the new binary and hands it the sockets; once it accepts, this process stops
/// accepting and serves its sessions until they end. The new process's id.
async fn upgrade(ctx: &Arc<Ctx>, listening: &Arc<Listening>, stop: [&watch::Sender<bool>; 2]) -> Result<u32, UpgradeError> {
    if ctx.handed_over() {
        return Err(UpgradeError::Refused("this process already handed its sockets over to a new one".into()));
    }
    let l = listening.clone();
    // (Ids this process may still give before the new one accepts stay below the new one's.)
    let first_id = ctx.sessions.peek_next_id().wrapping_add(1 << 20);
    let r = tokio::task::spawn_blocking(move || l.hand_over(first_id))
        .await
        .map_err(|e| UpgradeError::Refused(format!("the upgrade's thread: {e}")))
        .and_then(|r| r);
    let r = r.map(|(pid, channel)| {
        ctx.handoff.open(channel);
        pid
    });
    match &r {
        Ok(pid) => {
            ctx.set_handed_over();
            // A capture ends here, whole: the sessions it records leave for the new process.
            end_capture(ctx, "upgrade").await;
            for s in stop {
                let _ = s.send(true);
            }
            tracing::info!(
                new_pid = pid,
                sessions = ctx.sessions.len(),
                "upgrade: the new process accepts; this one stopped accepting and hands each session over at its next wait for a command (those that cannot go are served here until they end)"
            );
        }
        Err(e) => tracing::warn!(error = %e, "upgrade failed: this process goes on"),
    }
    r
}

/// Ends the running capture, if one runs, with its files whole and `meta.json` final.
async fn end_capture(ctx: &Arc<Ctx>, why: &'static str) {
    if ctx.capture.generation() != 0 {
        let c = ctx.clone();
        let _ = tokio::task::spawn_blocking(move || c.capture.end(why)).await;
        tracing::info!(why, "capture ended");
    }
}

/// Graceful shutdown: stop accepting, let sessions finish their transaction, then give up.
async fn drain(ctx: &Arc<Ctx>, stop_tx: &watch::Sender<bool>) {
    ctx.draining.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = stop_tx.send(true);
    let deadline = Instant::now() + ctx.config().proxy.shutdown_timeout;
    loop {
        for h in ctx.sessions.all() {
            h.wake.notify();
        }
        let left = ctx.sessions.len();
        if left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            tracing::warn!(sessions = left, "shutdown_timeout reached; closing the remaining sessions");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    end_capture(ctx, "shutdown").await;
    // Each worker's sweeper closes its pooled backend connections with COM_QUIT.
    let pool_deadline = Instant::now() + Duration::from_secs(2);
    while ctx.backends.list().iter().any(|b| b.pooled() > 0) && Instant::now() < pool_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // (Socket files handed over to a new process are its own now.)
    for l in ctx.config().listeners.iter().filter(|_| !ctx.handed_over()) {
        if let Ok(Address::Unix(p)) = parse_address(l.address.get_ref()) {
            let _ = std::fs::remove_file(p);
        }
    }
}
