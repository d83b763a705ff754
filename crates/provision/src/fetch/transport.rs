//! How fetches reach git hosts: the HTTP client gix uses, with our CA, proxy and timeouts.

use cloud_harness_error::{Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How to reach git hosts.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// PEM certificates trusted besides the system roots (`CLOUD_HARNESS_EXTRA_CA`).
    pub extra_ca: Option<Vec<u8>>,
    /// `HTTPS_PROXY`.
    pub proxy: Option<String>,
    /// The longest any one request may take, its answer read whole (none: as long as the
    /// caller's deadline lets it).
    pub timeout: Option<Duration>,
}

impl Transport {
    /// `HTTPS_PROXY` (or `https_proxy`), when set.
    pub fn proxy_from_env() -> Option<String> {
        ["HTTPS_PROXY", "https_proxy"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    pub fn from_env() -> Result<Transport> {
        let proxy = Transport::proxy_from_env();
        let extra_ca = match std::env::var_os("CLOUD_HARNESS_EXTRA_CA").filter(|v| !v.is_empty()) {
            Some(path) => {
                let pem = std::fs::read(&path).map_err(|e| Error::io(Path::new(&path), e))?;
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                    Error::invalid(format!(
                        "CLOUD_HARNESS_EXTRA_CA: {}: {e}",
                        Path::new(&path).display()
                    ))
                })?;
                Some(pem)
            }
            None => None,
        };
        Ok(Transport {
            extra_ca,
            proxy,
            timeout: None,
        })
    }

    fn configure(
        &self,
        builder: reqwest::blocking::ClientBuilder,
    ) -> gix::Result<reqwest::blocking::ClientBuilder> {
        let mut builder = builder;
        if let Some(pem) = &self.extra_ca {
            for cert in
                reqwest::Certificate::from_pem_bundle(pem).map_err(gix::error::Error::from_error)?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        builder = match &self.proxy {
            Some(p) => builder
                .proxy(reqwest::Proxy::https(p.as_str()).map_err(gix::error::Error::from_error)?),
            None => builder.no_proxy(),
        };
        Ok(builder)
    }
}

/// Makes `conn` reach its remote through `transport` (our proxy, CA and timeouts).
pub(crate) fn use_transport<T>(
    conn: &mut gix::remote::Connection<'_, '_, '_, T>,
    transport: &Transport,
) -> std::result::Result<(), gix::Error>
where
    T: gix::protocol::transport::client::blocking_io::Transport,
{
    let remote_url = conn
        .remote()
        .url(gix::remote::Direction::Fetch)
        .map(|u| u.to_bstring())
        .unwrap_or_default();
    let mut options = conn
        .remote()
        .repo()
        .transport_options(gix::bstr::BStr::new(&remote_url), None)?
        .unwrap_or_else(|| {
            Box::new(gix::protocol::transport::client::blocking_io::http::Options::default())
        });
    if let Some(http) =
        options.downcast_mut::<gix::protocol::transport::client::blocking_io::http::Options>()
    {
        let transport = transport.clone();
        http.backend = Some(Arc::new(Mutex::new(
            gix::protocol::transport::client::blocking_io::http::reqwest::Options {
                configure_client: Some(Box::new(move |b| transport.configure(b))),
                configure_request: None,
            },
        )));
    }
    conn.set_transport_options(options);
    Ok(())
}
