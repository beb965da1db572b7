//! MCP session binding: the session id a server answers `initialize` with
//! is bound, in the state store (so replicas agree), to the agent that
//! opened it; MCP admission refuses it to any other agent.

use super::{Admission, Env, Feature};
use crate::proxy::ctx::Plan;
use crate::proxy::mcp::{session_key, SESSION_TTL};
use pingora::http::ResponseHeader;

#[derive(Debug)]
pub struct SessionBinding {
    server: String,
}

impl Feature for SessionBinding {
    fn arm(adm: &Admission) -> Option<Self> {
        match &adm.plan {
            Plan::Mcp(m) if m.call.binds_session => Some(SessionBinding {
                server: m.call.server.clone(),
            }),
            _ => None,
        }
    }

    async fn response_header(
        &mut self,
        env: &Env<'_>,
        adm: &Admission,
        resp: &mut ResponseHeader,
    ) -> pingora::Result<()> {
        if !(200..300).contains(&resp.status.as_u16()) {
            return Ok(());
        }
        let Some(sid) = resp
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
        else {
            return Ok(());
        };
        let key = session_key(&self.server, &sid);
        let bound = env
            .store
            .record_swap(
                env.clock.now(),
                &key,
                None,
                adm.agent.as_bytes().to_vec(),
                SESSION_TTL,
            )
            .await;
        match bound {
            Ok(true) => {}
            // Already bound (a server reusing an id): the owner stays.
            Ok(false) => log::warn!(
                "request {}: MCP server `{}` reused a session id",
                adm.request_id,
                self.server
            ),
            // Unbound, the session is refused later (fail closed).
            Err(e) => log::warn!("request {}: session not bound: {e}", adm.request_id),
        }
        Ok(())
    }
}
