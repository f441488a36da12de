//! DISCONNECT and AUTH (sections 3.14, 3.15).

use crate::decode::{ack::reason_and_properties, reader::Reader};
use crate::error::DecodeError;
use crate::packet::{Auth, Disconnect, PacketType};
use crate::properties::Properties;
use crate::reason::ReasonCode;

pub(crate) fn disconnect(reader: &mut Reader<'_>, v5: bool) -> Result<Disconnect, DecodeError> {
    let (reason, properties) = if v5 {
        reason_and_properties(reader, PacketType::Disconnect)?
    } else {
        (ReasonCode::NORMAL_DISCONNECTION, Properties::default())
    };
    reader.finish()?;
    Ok(Disconnect { reason, properties })
}

/// AUTH exists only in 5.0; the fixed header check refuses it on 3.x connections.
pub(crate) fn auth(reader: &mut Reader<'_>) -> Result<Auth, DecodeError> {
    let (reason, properties) = reason_and_properties(reader, PacketType::Auth)?;
    reader.finish()?;
    Ok(Auth { reason, properties })
}
