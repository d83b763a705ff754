//! A TCP relay on loopback that holds every chunk a client sends for a fixed time before
//! passing it on: an object storage server on loopback made to answer each request as late as
//! a bucket across a network does (a request is one chunk; its answer comes back at once),
//! and, where asked, each connection's answers no faster than a set rate (a bucket serves
//! each connection at a bounded rate, which ranged requests under way at once add up); or, as
//! a proxy that does not know ranges, every partial answer turned into a whole one's status.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

pub struct Latency {
    pub addr: SocketAddr,
}

impl Latency {
    /// Relays connections to `upstream`, each chunk from a client `delay` late. The relay
    /// lives as long as the process (a bench's or a test's).
    pub fn start(upstream: SocketAddr, delay: Duration) -> Latency {
        Latency::paced(upstream, delay, None)
    }

    /// The same, each connection's answers at most `rate` bytes a second.
    pub fn paced(upstream: SocketAddr, delay: Duration, rate: Option<u64>) -> Latency {
        Latency::relaying(upstream, delay, rate, false)
    }

    /// Relays connections to `upstream` at once, each `206 Partial Content` answer said to be
    /// `200 OK` (its bytes as they are): a store that answers a range with something else.
    pub fn without_ranges(upstream: SocketAddr) -> Latency {
        Latency::relaying(upstream, Duration::ZERO, None, true)
    }

    fn relaying(upstream: SocketAddr, delay: Duration, rate: Option<u64>, whole: bool) -> Latency {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || relay(client, server, delay, None, false));
                std::thread::spawn(move || relay(s2, c2, Duration::ZERO, rate, whole));
            }
        });
        Latency { addr }
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream, delay: Duration, rate: Option<u64>, whole: bool) {
    let mut buf = vec![0u8; 64 << 10];
    // When the bytes sent so far may all have gone at `rate` (an idle connection earns no
    // credit for a later burst).
    let mut due = std::time::Instant::now();
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                let mut chunk = &buf[..n];
                // An answer's head comes first in a chunk of its own making.
                const PARTIAL: &[u8] = b"HTTP/1.1 206 Partial Content\r\n";
                if whole && chunk.starts_with(PARTIAL) {
                    if to.write_all(b"HTTP/1.1 200 OK\r\n").is_err() {
                        break;
                    }
                    chunk = &chunk[PARTIAL.len()..];
                }
                if to.write_all(chunk).is_err() {
                    break;
                }
                if let Some(rate) = rate {
                    let now = std::time::Instant::now();
                    due = due.max(now) + Duration::from_secs_f64(n as f64 / rate as f64);
                    std::thread::sleep(due - now);
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
