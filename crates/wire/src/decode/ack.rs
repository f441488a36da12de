//! PUBACK, PUBREC, PUBREL, PUBCOMP (sections 3.4–3.7).

use crate::decode::{packet_id, properties, reader::Reader};
use crate::error::DecodeError;
use crate::packet::{Ack, PacketType};
use crate::properties::Properties;
use crate::property_table::Place;
use crate::reason::{ReasonCode, allowed_in};

/// In 5.0 the reason code and the property length may be left out: remaining length 2 means
/// success without properties, 3 means a reason code without properties (3.4.2.1).
pub(crate) fn ack(
    reader: &mut Reader<'_>,
    packet_type: PacketType,
    v5: bool,
) -> Result<Ack, DecodeError> {
    let packet_id = packet_id(reader)?;
    let (reason, properties) = if v5 {
        reason_and_properties(reader, packet_type)?
    } else {
        (ReasonCode::SUCCESS, Properties::default())
    };
    reader.finish()?;
    Ok(Ack {
        packet_id,
        reason,
        properties,
    })
}

/// The optional "reason code, then optional properties" tail shared by 5.0 acks, DISCONNECT
/// and AUTH.
pub(crate) fn reason_and_properties(
    reader: &mut Reader<'_>,
    packet_type: PacketType,
) -> Result<(ReasonCode, Properties), DecodeError> {
    if reader.is_empty() {
        return Ok((ReasonCode::SUCCESS, Properties::default()));
    }
    let code = reader.u8()?;
    if !allowed_in(packet_type, code) {
        return Err(DecodeError::InvalidReasonCode {
            packet: packet_type,
            code,
        });
    }
    let properties = if reader.is_empty() {
        Properties::default()
    } else {
        properties::read(reader, Place::packet(packet_type))?
    };
    Ok((ReasonCode(code), properties))
}
