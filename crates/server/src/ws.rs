//! MQTT over WebSocket: the HTTP upgrade (path `/mqtt`, subprotocol `mqtt`) and an adapter
//! that makes the message stream a byte stream for the broker's transport seam.
//!
//! MQTT over WebSocket carries MQTT in binary messages; a packet may span messages and a
//! message may hold several packets (MQTT-6.0.0-1, MQTT-6.0.0-2: the adapter just joins the
//! payloads). A text message is a protocol error (MQTT-6.0.0-1): the connection ends.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use http::{HeaderValue, header};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_websockets::{Limits, Message, ServerBuilder, WebSocketStream};

/// The one path served (MQTT.js and paho-mqtt use it by default).
pub const WS_PATH: &str = "/mqtt";

/// A WebSocket message may carry this much beyond the broker's maximum packet size (a
/// client may pack a few packets in one message).
const WS_MESSAGE_SLACK_BYTES: usize = 64 * 1024;

/// Performs the upgrade on `stream` and returns the byte stream inside.
///
/// The 101 response always names the subprotocol `mqtt` (every MQTT client asks for it; the
/// library's builder takes fixed headers). A request for another path is answered 101 too
/// (the library answers before we see the path) and then closed.
pub async fn accept<S>(stream: S, max_packet_size_bytes: u32) -> io::Result<WsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = Limits::default().max_payload_len(Some(
        max_packet_size_bytes as usize + WS_MESSAGE_SLACK_BYTES,
    ));
    let builder = ServerBuilder::new()
        .limits(limits)
        .add_header(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("mqtt"),
        )
        .map_err(io::Error::other)?;
    let (request, socket) = builder.accept(stream).await.map_err(io::Error::other)?;
    if request.uri().path() != WS_PATH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("WebSocket path {} is not {WS_PATH}", request.uri().path()),
        ));
    }
    Ok(WsStream {
        socket,
        current: Bytes::new(),
        ended: false,
    })
}

/// A WebSocket connection as a byte stream: reads join the binary messages' payloads, each
/// write is sent as one binary message.
pub struct WsStream<S> {
    socket: WebSocketStream<S>,
    /// What is left of the message being read.
    current: Bytes,
    ended: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.current.is_empty() && !this.ended {
            match ready!(Pin::new(&mut this.socket).poll_next(cx)) {
                None => this.ended = true,
                Some(Err(error)) => return Poll::Ready(Err(io::Error::other(error))),
                Some(Ok(message)) if message.is_binary() => {
                    this.current = message.into_payload().into();
                }
                Some(Ok(message)) if message.is_close() => this.ended = true,
                Some(Ok(message)) if message.is_text() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text WebSocket message (MQTT needs binary)",
                    )));
                }
                // Ping and pong: the library answers pings itself.
                Some(Ok(_)) => {}
            }
        }
        let n = buf.remaining().min(this.current.len());
        buf.put_slice(&this.current[..n]);
        this.current.advance(n);
        if this.current.is_empty() {
            this.current = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let socket = Pin::new(&mut self.socket);
        let mut socket = socket;
        ready!(socket.as_mut().poll_ready(cx)).map_err(io::Error::other)?;
        socket
            .start_send(Message::binary(Bytes::copy_from_slice(buf)))
            .map_err(io::Error::other)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const UPGRADE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\nHost: x\r\n\r\n";

    /// A client binary frame (masked with a zero key, which leaves the payload as it is).
    fn frame(payload: &[u8]) -> Vec<u8> {
        assert!(payload.len() < 126);
        let mut out = vec![0x82, 0x80 | payload.len() as u8, 0, 0, 0, 0];
        out.extend_from_slice(payload);
        out
    }

    async fn read_response(client: &mut DuplexStream) -> String {
        let mut response = Vec::new();
        while !response.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            client.read_exact(&mut byte).await.unwrap();
            response.push(byte[0]);
        }
        String::from_utf8(response).unwrap()
    }

    #[tokio::test]
    async fn packets_span_frames_and_frames_hold_several_packets() {
        let (server, mut client) = tokio::io::duplex(4096);
        let accepting = tokio::spawn(accept(server, 1024));
        client
            .write_all(format!("GET /mqtt HTTP/1.1\r\n{UPGRADE}").as_bytes())
            .await
            .unwrap();
        let response = read_response(&mut client).await;
        assert!(response.starts_with("HTTP/1.1 101"), "{response}");
        assert!(
            response
                .to_lowercase()
                .contains("sec-websocket-protocol: mqtt"),
            "{response}"
        );
        let mut stream = accepting.await.unwrap().unwrap();
        // MQTT-6.0.0-2: a PINGREQ split over two frames, then one frame with two PINGREQs.
        let bytes = [0xc0, 0x00, 0xc0, 0x00, 0xc0, 0x00];
        client.write_all(&frame(&bytes[..1])).await.unwrap();
        client.write_all(&frame(&bytes[1..2])).await.unwrap();
        client.write_all(&frame(&bytes[2..])).await.unwrap();
        let mut read = [0u8; 6];
        stream.read_exact(&mut read).await.unwrap();
        assert_eq!(read, bytes);
        // A write leaves as one binary frame.
        stream.write_all(&[0xd0, 0x00]).await.unwrap();
        stream.flush().await.unwrap();
        let mut header = [0u8; 4];
        client.read_exact(&mut header).await.unwrap();
        assert_eq!(header, [0x82, 0x02, 0xd0, 0x00]);
        // MQTT-6.0.0-1: a text frame ends the connection.
        client
            .write_all(&[0x81, 0x81, 0, 0, 0, 0, b'x'])
            .await
            .unwrap();
        assert!(stream.read(&mut read).await.is_err());
    }

    #[tokio::test]
    async fn other_paths_are_refused() {
        let (server, mut client) = tokio::io::duplex(4096);
        let accepting = tokio::spawn(accept(server, 1024));
        client
            .write_all(format!("GET /other HTTP/1.1\r\n{UPGRADE}").as_bytes())
            .await
            .unwrap();
        let _ = read_response(&mut client).await;
        let error = accepting.await.unwrap().err().unwrap();
        assert!(error.to_string().contains("/other"), "{error}");
    }
}
