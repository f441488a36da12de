//! The bytes of a forwarded client, both ways, between its socket on this node and its link to
//! the leader. Each direction's buffer follows the traffic: [`MIN_PIPE_BUFFER_BYTES`] while the
//! client is idle or talks little (most of an idle forwarded client's memory on this node was
//! tokio's fixed 8 KiB a direction), doubled when a read fills it (a burst: a publisher's
//! window), up to [`MAX_PIPE_BUFFER_BYTES`], and back to the minimum once a read uses less
//! than an eighth of it.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Each direction's buffer while traffic is light: what an idle forwarded client holds.
pub const MIN_PIPE_BUFFER_BYTES: usize = 1024;
/// Each direction's buffer at most, under a burst (tokio's `copy_bidirectional` uses 8 KiB).
pub const MAX_PIPE_BUFFER_BYTES: usize = 16 * 1024;
const _: () = assert!(MIN_PIPE_BUFFER_BYTES.is_power_of_two() && MIN_PIPE_BUFFER_BYTES >= 8);
const _: () = assert!(MAX_PIPE_BUFFER_BYTES.is_power_of_two());

/// Copies `a` to `b` and `b` to `a` until both directions have ended: a direction ends at its
/// reader's end of stream, which shuts its writer down (a half-close travels on), or at the
/// first error, which ends both.
pub async fn copy_both_ways<A, B>(a: A, b: B) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (a_read, a_write) = tokio::io::split(a);
    let (b_read, b_write) = tokio::io::split(b);
    tokio::try_join!(one_way(a_read, b_write), one_way(b_read, a_write))?;
    Ok(())
}

/// One direction: read, write all of it and flush (a TLS link holds what it encrypted until
/// flushed), with the buffer sized by [`next_len`].
async fn one_way<R, W>(mut from: R, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; MIN_PIPE_BUFFER_BYTES];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        let len = next_len(buf.len(), n);
        if len != buf.len() {
            // A new vector, not a resize: shrinking must give the memory back.
            buf = vec![0u8; len];
        }
        debug_assert!((MIN_PIPE_BUFFER_BYTES..=MAX_PIPE_BUFFER_BYTES).contains(&buf.len()));
    }
}

/// The buffer's next length after a read of `read` bytes into `len`.
fn next_len(len: usize, read: usize) -> usize {
    if read == len {
        (len * 2).min(MAX_PIPE_BUFFER_BYTES)
    } else if read < len / 8 {
        MIN_PIPE_BUFFER_BYTES
    } else {
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_grows_with_full_reads_and_falls_back_when_little_comes() {
        let mut len = MIN_PIPE_BUFFER_BYTES;
        while len < MAX_PIPE_BUFFER_BYTES {
            let next = next_len(len, len);
            assert_eq!(next, len * 2);
            len = next;
        }
        assert_eq!(next_len(len, len), MAX_PIPE_BUFFER_BYTES, "capped");
        assert_eq!(next_len(len, len / 2), len, "a half-full read keeps it");
        assert_eq!(next_len(len, len / 8 - 1), MIN_PIPE_BUFFER_BYTES);
        assert_eq!(next_len(MIN_PIPE_BUFFER_BYTES, 1), MIN_PIPE_BUFFER_BYTES);
    }

    /// Bound on the test below: a half-close that does not travel leaves a read waiting.
    const MUST_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

    /// A megabyte each way at once, through pipes that deliver little per read, arrives
    /// intact; then one side's half-close reaches the other, which can still answer.
    #[tokio::test]
    async fn bytes_cross_both_ways_intact_and_a_half_close_travels() {
        tokio::time::timeout(MUST_WITHIN, cross_both_ways_and_half_close())
            .await
            .expect("a read still waits: a half-close did not travel");
    }

    async fn cross_both_ways_and_half_close() {
        let (client, client_far) = tokio::io::duplex(3000);
        let (leader, leader_far) = tokio::io::duplex(5000);
        let piping = tokio::spawn(copy_both_ways(client, leader));
        let up: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let down: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let (mut cr, mut cw) = tokio::io::split(client_far);
        let (mut lr, mut lw) = tokio::io::split(leader_far);
        let (up2, down2) = (up.clone(), down.clone());
        let sending = tokio::spawn(async move {
            cw.write_all(&up2).await.unwrap();
            cw.shutdown().await.unwrap(); // the client's half-close
            lw.write_all(&down2).await.unwrap();
            lw
        });
        let mut got_up = vec![0u8; up.len()];
        lr.read_exact(&mut got_up).await.unwrap();
        assert!(got_up == up, "client to leader");
        let mut got_down = vec![0u8; down.len()];
        cr.read_exact(&mut got_down).await.unwrap();
        assert!(got_down == down, "leader to client");
        // The client's end of stream reached the leader's side...
        assert_eq!(lr.read(&mut [0u8; 1]).await.unwrap(), 0);
        // ...and the leader's side still answers, then closes too.
        let mut lw = sending.await.unwrap();
        lw.write_all(b"bye").await.unwrap();
        lw.shutdown().await.unwrap();
        let mut rest = Vec::new();
        cr.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"bye");
        piping.await.unwrap().unwrap();
    }
}
