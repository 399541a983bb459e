//! A small RESP2/RESP3 client on a plain `TcpStream`.
//!
//! Why not `redis::Connection` everywhere: the waiting clients need a read
//! with a deadline that can end mid-reply without losing bytes (pub/sub
//! fallback timeouts), RESP3 pushes on a connection that also runs commands
//! (10,000 subscribers would need 20,000 connections otherwise), and
//! non-blocking reads over thousands of connections from one thread. The
//! parser works on a buffer, so a timeout or a partial read never loses a
//! reply. `redis::Connection` still drives the control connection and loads.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a blocking read or write may take before the bench gives up:
/// a hung server fails the run instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest socket timeout one read waits before it is set again.
const TIMEOUT_SLICE: Duration = Duration::from_millis(100);

/// One reply, RESP2 and RESP3 folded together (maps and sets become arrays).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
    /// A RESP3 out-of-band push: pub/sub messages and (un)subscribe replies.
    Push(Vec<Reply>),
}

impl Reply {
    /// The integer, if this is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// A pub/sub push (RESP2 array or RESP3 push) of this kind
    /// (`message`, `subscribe`, `unsubscribe`).
    pub fn is_pubsub(&self, kind: &str) -> bool {
        match self {
            Reply::Push(items) | Reply::Array(items) => {
                matches!(items.first(), Some(Reply::Bulk(k)) if k.eq_ignore_ascii_case(kind.as_bytes()))
            }
            _ => false,
        }
    }

    /// Turns an error reply into an `io::Error` naming the command.
    pub fn check(self, what: &str) -> io::Result<Reply> {
        match self {
            Reply::Error(e) => Err(io::Error::other(format!("{what}: -{e}"))),
            ok => Ok(ok),
        }
    }
}

/// Appends one command in RESP multibulk form.
pub fn encode(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one reply from the front of `buf`: `Ok(None)` if it is incomplete,
/// else the reply and how many bytes it took.
pub fn parse(buf: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let Some(line_end) = find_crlf(buf) else {
        return Ok(None);
    };
    let Some((&kind, line)) = buf[..line_end].split_first() else {
        return Err(bad("empty line"));
    };
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> io::Result<i64> { text().parse().map_err(|_| bad("bad length or integer")) };
    let after = line_end + 2;
    let reply = match kind {
        b'+' | b',' | b'(' => Reply::Status(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Int(number()?),
        b'#' => Reply::Int(i64::from(line == b"t")),
        b'_' => Reply::Nil,
        b'$' | b'=' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Reply::Nil, after)));
            }
            let end = after + len as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            return Ok(Some((Reply::Bulk(buf[after..end].to_vec()), end + 2)));
        }
        b'*' | b'~' | b'>' | b'%' => {
            let count = number()?;
            if count < 0 {
                return Ok(Some((Reply::Nil, after)));
            }
            // A map has a key and a value per entry.
            let count = if kind == b'%' { count * 2 } else { count } as usize;
            let mut items = Vec::with_capacity(count.min(1024));
            let mut at = after;
            for _ in 0..count {
                match parse(&buf[at..])? {
                    Some((item, used)) => {
                        items.push(item);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            let reply = if kind == b'>' {
                Reply::Push(items)
            } else {
                Reply::Array(items)
            };
            return Ok(Some((reply, at)));
        }
        other => return Err(bad(&format!("unknown reply type {:?}", other as char))),
    };
    Ok(Some((reply, after)))
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn bad(what: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, format!("RESP: {what}"))
}

/// One connection: a socket, the bytes read but not yet parsed, and the
/// commands queued but not yet written.
pub struct Conn {
    stream: TcpStream,
    /// Bytes read; those before `parsed` are replies already returned (kept
    /// until the next read, so a pipeline of replies costs no memmove each).
    input: Vec<u8>,
    parsed: usize,
    output: Vec<u8>,
}

impl Conn {
    /// Connects to the server on loopback; blocking, with [`IO_TIMEOUT`].
    pub fn connect(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn {
            stream,
            input: Vec::with_capacity(256),
            parsed: 0,
            output: Vec::with_capacity(256),
        })
    }

    /// Queues a command; [`Conn::flush`] or [`Conn::try_flush`] writes it.
    pub fn queue(&mut self, args: &[&str]) {
        encode(&mut self.output, args);
    }

    /// Writes everything queued (blocking mode).
    pub fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.output)?;
        self.output.clear();
        Ok(())
    }

    /// Writes what the socket takes now (non-blocking mode).
    pub fn try_flush(&mut self) -> io::Result<()> {
        while !self.output.is_empty() {
            match self.stream.write(&self.output) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.output.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Queues and writes one command.
    pub fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.queue(args);
        self.flush()
    }

    /// Sends one command and reads its reply (error replies included).
    pub fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// The next reply, waiting up to [`IO_TIMEOUT`].
    pub fn read(&mut self) -> io::Result<Reply> {
        let deadline = Instant::now() + IO_TIMEOUT;
        self.read_until(deadline)?
            .ok_or_else(|| io::Error::new(ErrorKind::TimedOut, "no reply within the I/O timeout"))
    }

    /// The next reply, or `None` once `deadline` passes without one.
    pub fn read_until(&mut self, deadline: Instant) -> io::Result<Option<Reply>> {
        loop {
            if let Some(reply) = self.take_parsed()? {
                return Ok(Some(reply));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // A zero timeout means "forever" to the OS: keep at least 1 µs.
            // A socket timeout runs on the kernel's timer wheel, whose
            // granularity grows with the timeout (about an eighth of it: a
            // 30 s wait woke up to a second late); slices of at most
            // `TIMEOUT_SLICE` keep a wait within a tick of its deadline.
            self.stream
                .set_read_timeout(Some(left.clamp(Duration::from_micros(1), TIMEOUT_SLICE)))?;
            match self.fill() {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Non-blocking mode for [`Conn::poll_reply`] and [`Conn::try_flush`].
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.stream.set_nonblocking(on)
    }

    /// A reply if one is buffered or readable now (non-blocking mode).
    pub fn poll_reply(&mut self) -> io::Result<Option<Reply>> {
        if let Some(reply) = self.take_parsed()? {
            return Ok(Some(reply));
        }
        match self.fill() {
            Ok(()) => self.take_parsed(),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads once from the socket into the input buffer.
    fn fill(&mut self) -> io::Result<()> {
        self.input.drain(..self.parsed);
        self.parsed = 0;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.input.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn take_parsed(&mut self) -> io::Result<Option<Reply>> {
        match parse(&self.input[self.parsed..])? {
            Some((reply, used)) => {
                self.parsed += used;
                Ok(Some(reply))
            }
            None => Ok(None),
        }
    }
}
