//! The egress proxy's judgement of a request head: whatever the bytes, it only ever lets a
//! CONNECT through to an allowlisted name whose address is not special-purpose.
#![no_main]

use cloud_harness_control::hosts::HostPolicy;
use cloud_harness_provision::egress::{classify, decide, EgressPolicy, Resolve, Verdict};
use libfuzzer_sys::fuzz_target;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};

/// Answers at once, from a table: names on and off the allowlist, public and private.
struct Table;

impl Resolve for Table {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        _port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
        let answer = match host {
            "github.com" => Ok(vec!["140.82.112.3".parse().unwrap()]),
            "inside.github.com" => Ok(vec!["10.1.2.3".parse().unwrap()]),
            "mixed.github.com" => Ok(vec![
                "140.82.112.4".parse().unwrap(),
                "::ffff:127.0.0.1".parse().unwrap(),
            ]),
            _ => Err(std::io::Error::other("no such name")),
        };
        Box::pin(std::future::ready(answer))
    }
}

static POLICY: LazyLock<EgressPolicy> = LazyLock::new(|| {
    let hosts = HostPolicy::new("github.com,*.github.com", "").unwrap();
    EgressPolicy::new(hosts, "", "").unwrap()
});

fuzz_target!(|data: &[u8]| {
    let head = String::from_utf8_lossy(data);
    let mut decision = Box::pin(decide(&POLICY, &Table, &head));
    let Poll::Ready(d) = decision
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("the decision waited on a resolver that answers at once");
    };
    if let Verdict::Allow(to) = d.verdict {
        assert!(head.starts_with("CONNECT "), "{head:?}");
        assert!(POLICY.hosts.allows(&d.host, d.port), "{d:?}");
        assert_eq!(to.port(), d.port);
        assert!(
            d.addresses.iter().all(|ip| classify(*ip).is_none()),
            "{d:?}"
        );
    }
});
