//! How batchd reaches Redis: one server (plain or TLS, with ACL credentials in the URL), a Redis Cluster, or the
//! master behind Redis Sentinel — behind one connection type, so the storage code never cares which.
//!
//! Every connection is lazy and heals itself: a standalone server goes through redis-rs's `ConnectionManager`;
//! Cluster and Sentinel connections are dropped on a connection-level error and rebuilt on the next command (for
//! Sentinel that means asking the sentinels for the *current* master, which is how a failover is followed).
//!
//! TLS is never silently dropped: a `rediss://` URL means TLS to that server (in Sentinel mode the master URL decides
//! for the master and each node URL for its sentinel), with the configured CA and client certificate.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsMode, Value,
};
use tokio::sync::Mutex;

use crate::StoreError;

/// Which kind of Redis deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One server (possibly with replicas batchd does not use).
    Standalone,
    /// Redis Cluster: `url` and `nodes` are seed nodes.
    Cluster,
    /// Redis Sentinel: `nodes` are the sentinels; `url` carries the master's credentials, database and whether the
    /// master is reached over TLS (`rediss://`).
    Sentinel,
}

/// Everything needed to connect.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://` or `rediss://` URL (standalone server, a cluster seed, or the master's credentials for Sentinel).
    pub url: String,
    /// The deployment kind.
    pub topology: Topology,
    /// Cluster seed nodes or sentinel addresses (URLs).
    pub nodes: Vec<String>,
    /// The master's name, for Sentinel.
    pub sentinel_master: String,
    /// PEM file of the CA that signed the server's certificate (TLS), instead of the system trust store.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate and key for mutual TLS.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// Longest wait for one reply on the shared connection.
    pub response_timeout: Duration,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("topology", &self.topology)
            .field("nodes", &self.nodes.len())
            .field("sentinel_master", &self.sentinel_master)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish_non_exhaustive()
    }
}

/// A way to open connections to the configured Redis. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    /// What to connect to.
    kind: Arc<EndpointKind>,
    /// Longest wait for one reply on the shared connection.
    response_timeout: Duration,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match *self.kind {
            EndpointKind::Standalone(_) => "standalone",
            EndpointKind::Cluster(_) => "cluster",
            EndpointKind::Sentinel(_) => "sentinel",
        };
        f.debug_struct("Endpoint").field("kind", &kind).finish()
    }
}

enum EndpointKind {
    Standalone(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    Sentinel(Mutex<redis::sentinel::SentinelClient>),
}

impl Endpoint {
    /// Validates the settings and prepares the clients (no connection is opened yet).
    pub fn new(settings: &RedisSettings) -> Result<Self, StoreError> {
        let certificates = tls_certificates(settings)?;
        let kind = match settings.topology {
            Topology::Standalone => EndpointKind::Standalone(match certificates {
                Some(certificates) => redis::Client::build_with_tls(settings.url.as_str(), certificates)?,
                None => redis::Client::open(settings.url.as_str())?,
            }),
            Topology::Cluster => {
                let mut seeds = vec![settings.url.clone()];
                seeds.extend(settings.nodes.iter().cloned());
                let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
                    .response_timeout(settings.response_timeout)
                    .connection_timeout(Duration::from_secs(5));
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                EndpointKind::Cluster(builder.build()?)
            }
            Topology::Sentinel => EndpointKind::Sentinel(Mutex::new(sentinel_client(settings, certificates)?)),
        };
        Ok(Self { kind: Arc::new(kind), response_timeout: settings.response_timeout })
    }

    /// The shared, auto-reconnecting connection for scripts and short commands.
    pub fn shared(&self) -> Result<Conn, StoreError> {
        match &*self.kind {
            EndpointKind::Standalone(client) => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(self.response_timeout))
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(2));
                Ok(Conn::Managed(ConnectionManager::new_lazy_with_config(client.clone(), config)?))
            }
            _ => Ok(Conn::Healing(Healing::new(self.clone(), self.response_timeout))),
        }
    }

    /// A connection of its own for one blocking reader (`XREADGROUP ... BLOCK`), whose replies may take up to
    /// `response_timeout`. Opened lazily; it heals like the shared one.
    pub fn dedicated(&self, response_timeout: Duration) -> Conn {
        Conn::Healing(Healing::new(self.clone(), response_timeout))
    }

    /// Opens one raw connection now.
    async fn open(&self, response_timeout: Duration) -> RedisResult<Raw> {
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(response_timeout))
            .set_connection_timeout(Some(Duration::from_secs(5)));
        match &*self.kind {
            EndpointKind::Standalone(client) => {
                Ok(Raw::Single(client.get_multiplexed_async_connection_with_config(&config).await?))
            }
            EndpointKind::Cluster(client) => {
                let cluster_config = redis::cluster::ClusterConfig::new()
                    .set_response_timeout(response_timeout)
                    .set_connection_timeout(Duration::from_secs(5));
                Ok(Raw::Cluster(client.get_async_connection_with_config(cluster_config).await?))
            }
            EndpointKind::Sentinel(sentinel) => {
                let client = sentinel.lock().await.async_get_client().await?;
                Ok(Raw::Single(client.get_multiplexed_async_connection_with_config(&config).await?))
            }
        }
    }
}

fn config_error(message: &str) -> StoreError {
    StoreError::Redis(RedisError::from((redis::ErrorKind::InvalidClientConfig, "configuration", message.to_owned())))
}

/// The client that asks the sentinels for the current master.
///
/// TLS goes wherever a URL says `rediss://`: the master URL decides for the master, each sentinel's URL for that
/// sentinel, and the CA and client certificate apply to all of them. The master's user, password and database come
/// from the master URL; the sentinels' user and password from their URLs (redis-rs takes one pair for all sentinels,
/// so the URLs must agree).
fn sentinel_client(
    settings: &RedisSettings,
    certificates: Option<redis::TlsCertificates>,
) -> Result<SentinelClient, StoreError> {
    if settings.nodes.is_empty() {
        return Err(config_error("redis.nodes must list the sentinels when redis.mode is sentinel"));
    }
    let master = settings.url.as_str().into_connection_info()?;
    let sentinels =
        settings.nodes.iter().map(|node| node.as_str().into_connection_info()).collect::<RedisResult<Vec<_>>>()?;
    if certificates.is_some()
        && tls_mode(master.addr()).is_none()
        && sentinels.iter().all(|s| tls_mode(s.addr()).is_none())
    {
        return Err(config_error(
            "redis.tls_ca_file, redis.tls_cert_file and redis.tls_key_file need a rediss:// URL in redis.url or redis.nodes",
        ));
    }
    let sentinel_auth = |info: &ConnectionInfo| {
        let redis = info.redis_settings();
        (redis.username().map(str::to_owned), redis.password().map(str::to_owned))
    };
    let (sentinel_username, sentinel_password) = sentinel_auth(&sentinels[0]);
    if sentinels.iter().any(|info| sentinel_auth(info) != (sentinel_username.clone(), sentinel_password.clone())) {
        return Err(config_error("redis.nodes: every sentinel URL must carry the same user and password"));
    }
    let addrs = sentinels
        .into_iter()
        .map(|info| sentinel_addr(info, certificates.as_ref()))
        .collect::<RedisResult<Vec<_>>>()?;

    let redis = master.redis_settings();
    let mut builder = SentinelClientBuilder::new(addrs, &settings.sentinel_master, SentinelServerType::Master)?
        .set_client_to_redis_db(redis.db())
        .set_client_to_redis_protocol(redis.protocol());
    if let Some(username) = redis.username() {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(password) = redis.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(mode) = tls_mode(master.addr()) {
        builder = builder.set_client_to_redis_tls_mode(mode);
        if let Some(certificates) = certificates {
            builder = builder.set_client_to_redis_certificates(certificates);
        }
    }
    if let Some(username) = sentinel_username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    Ok(builder.build()?)
}

/// A sentinel's address as its URL gives it, carrying the CA and client certificate when the URL is `rediss://`.
fn sentinel_addr(info: ConnectionInfo, certificates: Option<&redis::TlsCertificates>) -> RedisResult<ConnectionAddr> {
    match (tls_mode(info.addr()), certificates) {
        (Some(_), Some(certificates)) => {
            Ok(redis::Client::build_with_tls(info, certificates.clone())?.get_connection_info().addr().clone())
        }
        _ => Ok(info.addr().clone()),
    }
}

/// Whether an address asks for TLS, and with certificate checks (`rediss://`) or without (`rediss://...#insecure`).
fn tls_mode(addr: &ConnectionAddr) -> Option<TlsMode> {
    match addr {
        ConnectionAddr::TcpTls { insecure: false, .. } => Some(TlsMode::Secure),
        ConnectionAddr::TcpTls { insecure: true, .. } => Some(TlsMode::Insecure),
        _ => None,
    }
}

fn tls_certificates(settings: &RedisSettings) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let read = |path: &PathBuf, key: &str| {
        std::fs::read(path).map_err(|e| config_error(&format!("{key}: cannot read {}: {e}", path.display())))
    };
    let root_cert = settings.tls_ca_file.as_ref().map(|path| read(path, "redis.tls_ca_file")).transpose()?;
    let client_tls = match &settings.tls_client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "redis.tls_cert_file")?,
            client_key: read(key, "redis.tls_key_file")?,
        }),
        None => None,
    };
    Ok((root_cert.is_some() || client_tls.is_some()).then_some(redis::TlsCertificates { client_tls, root_cert }))
}

/// Whether `error` means the server (or the role a connection needs, a writable master) cannot be reached now:
/// the connection dropped, was refused or timed out, or the server is loading, read-only or without a master. A
/// healing connection reconnects after one; a reader (the dashboard) says "Redis unreachable" and tries again.
pub fn is_unreachable(error: &RedisError) -> bool {
    error.is_connection_dropped()
        || error.is_io_error()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A connection to whichever Redis is configured.
#[derive(Clone)]
pub enum Conn {
    /// Standalone server through redis-rs's reconnecting manager.
    Managed(ConnectionManager),
    /// Cluster, Sentinel, or a dedicated reader: rebuilt after connection-level errors.
    Healing(Healing),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Managed(_) => "Conn::Managed",
            Self::Healing(_) => "Conn::Healing",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Managed(conn) => conn.req_packed_command(cmd),
            Self::Healing(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Managed(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Healing(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Managed(conn) => conn.get_db(),
            Self::Healing(_) => 0,
        }
    }
}

enum Raw {
    Single(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    fn clone_handle(&self) -> Self {
        match self {
            Self::Single(conn) => Self::Single(conn.clone()),
            Self::Cluster(conn) => Self::Cluster(conn.clone()),
        }
    }
}

/// A lazily opened connection that is dropped after a connection-level error and reopened by the next command.
#[derive(Clone)]
pub struct Healing {
    /// Where to (re)connect.
    endpoint: Endpoint,
    /// Reply timeout of the connection.
    response_timeout: Duration,
    /// The open connection, if any.
    current: Arc<Mutex<Option<Raw>>>,
}

impl fmt::Debug for Healing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Healing")
            .field("endpoint", &self.endpoint)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl Healing {
    fn new(endpoint: Endpoint, response_timeout: Duration) -> Self {
        Self { endpoint, response_timeout, current: Arc::new(Mutex::new(None)) }
    }

    async fn get(&self) -> RedisResult<Raw> {
        let mut current = self.current.lock().await;
        if let Some(raw) = current.as_ref() {
            return Ok(raw.clone_handle());
        }
        let raw = self.endpoint.open(self.response_timeout).await?;
        let handle = raw.clone_handle();
        *current = Some(raw);
        Ok(handle)
    }

    /// Forgets the connection when `error` means it (or the server role behind it) is gone.
    async fn after_error(&self, error: &RedisError) {
        if is_unreachable(error) {
            *self.current.lock().await = None;
        }
    }

    /// Records the outcome of one call: a connection-level error drops the connection.
    async fn settle<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(error) = &result {
            self.after_error(error).await;
        }
        result
    }

    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let result = match &mut self.get().await? {
                Raw::Single(conn) => conn.req_packed_command(cmd).await,
                Raw::Cluster(conn) => conn.req_packed_command(cmd).await,
            };
            self.settle(result).await
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            let result = match &mut self.get().await? {
                Raw::Single(conn) => conn.req_packed_commands(pipeline, offset, count).await,
                Raw::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count).await,
            };
            self.settle(result).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel_settings(url: &str, nodes: &[&str]) -> RedisSettings {
        RedisSettings {
            url: url.to_owned(),
            topology: Topology::Sentinel,
            nodes: nodes.iter().map(|node| (*node).to_owned()).collect(),
            sentinel_master: "mymaster".to_owned(),
            tls_ca_file: None,
            tls_client: None,
            response_timeout: Duration::from_secs(1),
        }
    }

    /// An empty trust store: enough to see where certificates go without reading a file.
    fn certificates() -> redis::TlsCertificates {
        redis::TlsCertificates { client_tls: None, root_cert: Some(Vec::new()) }
    }

    fn addr(url: &str) -> ConnectionAddr {
        url.into_connection_info().expect("valid url").addr().clone()
    }

    #[test]
    fn the_url_scheme_decides_tls() {
        assert_eq!(tls_mode(&addr("redis://127.0.0.1:26379")), None);
        assert_eq!(tls_mode(&addr("rediss://127.0.0.1:26379")), Some(TlsMode::Secure));
        assert_eq!(tls_mode(&addr("rediss://127.0.0.1:26379/#insecure")), Some(TlsMode::Insecure));
    }

    #[test]
    fn a_tls_sentinel_gets_the_certificates_and_a_plain_one_stays_plain() {
        let info = |url: &str| url.into_connection_info().expect("valid url");
        let tls = sentinel_addr(info("rediss://127.0.0.1:26379"), Some(&certificates())).expect("tls sentinel");
        assert!(matches!(tls, ConnectionAddr::TcpTls { insecure: false, tls_params: Some(_), .. }), "{tls:?}");
        let plain = sentinel_addr(info("redis://127.0.0.1:26379"), Some(&certificates())).expect("plain sentinel");
        assert!(matches!(plain, ConnectionAddr::Tcp(..)), "{plain:?}");
    }

    #[test]
    fn sentinel_mode_builds_with_tls_and_with_mixed_urls() {
        let tls = sentinel_settings("rediss://batchd:pw@127.0.0.1:1/2", &["rediss://sentinel:pw@127.0.0.1:26379"]);
        assert!(sentinel_client(&tls, Some(certificates())).is_ok());
        let mixed = sentinel_settings("rediss://127.0.0.1:1", &["redis://127.0.0.1:26379", "rediss://127.0.0.1:26380"]);
        assert!(sentinel_client(&mixed, Some(certificates())).is_ok());
        let plain = sentinel_settings("redis://127.0.0.1:1", &["redis://127.0.0.1:26379"]);
        assert!(Endpoint::new(&plain).is_ok());
    }

    #[test]
    fn certificates_without_any_tls_url_are_refused() {
        let plain = sentinel_settings("redis://127.0.0.1:1", &["redis://127.0.0.1:26379"]);
        let Err(error) = sentinel_client(&plain, Some(certificates())) else { panic!("certificates need a TLS url") };
        assert!(error.to_string().contains("rediss://"), "{error}");
    }

    #[test]
    fn sentinels_with_different_credentials_are_refused() {
        let settings =
            sentinel_settings("redis://127.0.0.1:1", &["redis://a:pw@127.0.0.1:26379", "redis://b:pw@127.0.0.1:26380"]);
        let Err(error) = sentinel_client(&settings, None) else { panic!("one user and password for all sentinels") };
        assert!(error.to_string().contains("same user and password"), "{error}");
    }

    #[test]
    fn sentinel_mode_needs_sentinels() {
        let Err(error) = Endpoint::new(&sentinel_settings("redis://127.0.0.1:1", &[])) else { panic!("no sentinels") };
        assert!(error.to_string().contains("redis.nodes"), "{error}");
    }
}
