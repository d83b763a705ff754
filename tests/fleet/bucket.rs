//! A bucket on loopback that answers for what it holds and never answers for the rest: a
//! request for a key it lacks is held open, unanswered, until the client gives up, and the
//! bucket counts such requests (how many at once, and which keys). For what a download does
//! while object storage is slow; `s3s-fs` answers everything at once.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const BUCKET: &str = "stalling";

#[derive(Default)]
struct Seen {
    /// Requests held open now, and the most at once.
    held: usize,
    most_held: usize,
    /// Every key asked for.
    asked: BTreeSet<String>,
}

pub struct Bucket {
    pub addr: SocketAddr,
    objects: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

impl Bucket {
    pub fn start() -> Bucket {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let bucket = Bucket {
            addr,
            objects: Arc::default(),
            seen: Arc::default(),
            stop: Arc::default(),
        };
        let (objects, seen, stop) = (
            bucket.objects.clone(),
            bucket.seen.clone(),
            bucket.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (objects, seen, stop) = (objects.clone(), seen.clone(), stop.clone());
                std::thread::spawn(move || serve(conn, &objects, &seen, &stop));
            }
        });
        bucket
    }

    /// Holds `bytes` at `key` (below the bucket).
    pub fn put(&self, key: &str, bytes: Vec<u8>) {
        self.objects.lock().unwrap().insert(key.to_owned(), bytes);
    }

    /// The most requests held open at once so far.
    pub fn most_held(&self) -> usize {
        self.seen.lock().unwrap().most_held
    }

    /// Whether some request asked for `key`.
    pub fn asked(&self, key: &str) -> bool {
        self.seen.lock().unwrap().asked.contains(key)
    }

    /// `s3://stalling/<prefix>` and the settings that reach it.
    pub fn remote(&self, prefix: &str) -> cloud_harness_provision::remote::RemoteStore {
        let endpoint = format!("http://{}", self.addr);
        cloud_harness_provision::remote::RemoteStore::open(
            &format!("s3://{BUCKET}/{prefix}"),
            &[
                ("AWS_ENDPOINT_URL", &endpoint),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_REGION", "us-east-1"),
                ("AWS_ACCESS_KEY_ID", "stalling"),
                ("AWS_SECRET_ACCESS_KEY", "stalling-secret"),
            ],
        )
        .unwrap()
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// One connection: each request answered with the object, or held open until the client
/// leaves.
fn serve(
    mut conn: TcpStream,
    objects: &Mutex<HashMap<String, Vec<u8>>>,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        let text = String::from_utf8_lossy(&head).into_owned();
        head.clear();
        let path = text.split(' ').nth(1).unwrap_or_default();
        let key = path
            .strip_prefix(&format!("/{BUCKET}/"))
            .unwrap_or_default()
            .to_owned();
        seen.lock().unwrap().asked.insert(key.clone());
        let found = objects.lock().unwrap().get(&key).cloned();
        let Some(body) = found else {
            hold(conn, seen, stop);
            return;
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nLast-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\nETag: \"e\"\r\n\r\n",
            body.len()
        );
        if conn.write_all(answer.as_bytes()).is_err() || conn.write_all(&body).is_err() {
            return;
        }
    }
}

/// Keeps a request unanswered until the client closes its connection.
fn hold(mut conn: TcpStream, seen: &Mutex<Seen>, stop: &AtomicBool) {
    {
        let mut s = seen.lock().unwrap();
        s.held += 1;
        s.most_held = s.most_held.max(s.held);
    }
    conn.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    seen.lock().unwrap().held -= 1;
}
