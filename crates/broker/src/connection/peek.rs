//! What a CONNECT that failed to decode still tells, read from its raw bytes: its protocol
//! level, and whether it is laid out as a v5 one. The handshake answers a bad CONNECT in the
//! form the client can read (MQTT-3.1.2-2; MQTT 5 §3.2.2.2).

/// The protocol level of the CONNECT at the front of `buf`, if enough of it is there.
pub(super) fn peek_connect_level(buf: &[u8]) -> Option<u8> {
    if buf.first()? >> 4 != 1 {
        return None;
    }
    // Skip the remaining length (1 to 4 bytes).
    let (_, used) = tern_wire::parse_varint(buf.get(1..)?)?;
    let offset = 1 + used;
    let name_len = usize::from(u16::from_be_bytes([
        *buf.get(offset)?,
        *buf.get(offset + 1)?,
    ]));
    buf.get(offset + 2 + name_len).copied()
}

/// Whether the CONNECT at the front of `buf` reads as a v5 one (a property block before the
/// client id) and not as a 3.x one, whatever its level says: only such a client can read a v5
/// CONNACK. Without will, username and password flags the client id must end the packet.
pub(super) fn connect_is_v5_shaped(buf: &[u8]) -> bool {
    let Some(body) = connect_body(buf) else {
        return false;
    };
    let Some(name_len) = read_u16(body, 0) else {
        return false;
    };
    // Protocol name, level, flags, keep alive.
    let fixed = 2 + usize::from(name_len) + 4;
    let (Some(flags), Some(rest)) = (body.get(fixed - 3), body.get(fixed..)) else {
        return false;
    };
    let exact = flags & 0xC4 == 0;
    let string_end = |at: usize| {
        read_u16(rest, at)
            .map(|n| at + 2 + usize::from(n))
            .filter(|&end| {
                if exact {
                    end == rest.len()
                } else {
                    end <= rest.len()
                }
            })
    };
    let v5 = tern_wire::parse_varint(rest)
        .and_then(|(props_len, used)| string_end(used + props_len as usize));
    v5.is_some() && string_end(0).is_none()
}

/// The body of the packet at the front of `buf` (as much of it as is there).
fn connect_body(buf: &[u8]) -> Option<&[u8]> {
    let (len, used) = tern_wire::parse_varint(buf.get(1..)?)?;
    let start = 1 + used;
    buf.get(start..(start + len as usize).min(buf.len()))
}

fn read_u16(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*data.get(at)?, *data.get(at + 1)?]))
}

#[cfg(test)]
mod tests {
    use super::peek_connect_level;

    #[test]
    fn peeks_the_protocol_level() {
        let v5 = [0x10, 0x10, 0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60];
        assert_eq!(peek_connect_level(&v5), Some(5));
        let v31 = [0x10, 0x10, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3];
        assert_eq!(peek_connect_level(&v31), Some(3));
        assert_eq!(peek_connect_level(&[0x10, 0x10, 0]), None);
        assert_eq!(peek_connect_level(&[0x30, 0x10, 0, 4]), None);
    }

    #[test]
    fn tells_v5_shaped_connects_from_3x_ones() {
        use super::connect_is_v5_shaped;
        // Level 6, then keep alive, then: v3 layout (client id "x") / v5 layout (no properties).
        let v3 = [
            0x10, 0x0d, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 0, 0, 1, b'x',
        ];
        let v5 = [
            0x10, 0x0e, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 0, 0, 0, 1, b'x',
        ];
        assert!(!connect_is_v5_shaped(&v3));
        assert!(connect_is_v5_shaped(&v5));
        assert!(!connect_is_v5_shaped(&v5[..5]));
    }
}
