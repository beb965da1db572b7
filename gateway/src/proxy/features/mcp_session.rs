//! MCP session binding: the session id a server answers `initialize` with
//! is bound, in the state store (so replicas agree), to the agent that
//! opened it, under that agent's name; MCP admission ([`check_owner`])
//! finds it for no other agent. An agent holds a bounded number of live sessions (the memory
//! store's `MAX_SESSIONS`): past it, its `initialize` is answered with an
//! error, and nobody else's session makes room.

use super::{Admission, Env, Feature};
use crate::proxy::ctx::Plan;
use crate::error::GatewayError;
use crate::proxy::admit::FailMode;
use crate::proxy::failure;
use crate::proxy::mcp::{session_key, SESSION_TTL};
use loopgate_policy::{Deny, DenyCode};
use pingora::http::ResponseHeader;

/// At admission: a session belongs to the agent that opened it. Another
/// agent's, an unknown or an expired one is refused (404 for one this
/// agent cannot see: the client starts a new session); an unreadable
/// store is decided by `fail`.
pub async fn check_owner(
    env: &Env<'_>,
    agent: &str,
    server: &str,
    sid: &str,
    fail: &mut FailMode,
) -> Result<(), GatewayError> {
    let owner = env
        .store
        .record_get(env.clock.now(), &session_key(agent, server, sid))
        .await
        .map_err(|e| Deny::new(DenyCode::StateUnavailable, e.to_string()).into());
    match fail.tolerate(owner)? {
        // Unreadable under `fail_mode: open`: not checked.
        None => Ok(()),
        Some(Some((_, owner))) if owner == agent.as_bytes() => Ok(()),
        Some(Some(_)) => Err(Deny::new(
            DenyCode::SessionNotOwned,
            "this MCP session belongs to another agent",
        )
        .never_retryable()
        .into()),
        Some(None) => Err(
            Deny::new(DenyCode::NotFound, "unknown MCP session: initialize again")
                .never_retryable()
                .into(),
        ),
    }
}

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
        let key = session_key(&adm.agent, &self.server, &sid);
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
            Ok(false) => {
                let now = env.clock.now();
                if let Ok(None) = env.store.record_get(now, &key).await {
                    // Not bound and no binding there: the agent is at its
                    // bound. The session is not handed out unbound.
                    // The server answered well: no breaker counts this.
                    return Err(failure::answer(
                        failure::GATEWAY_FAULT,
                        GatewayError::Denied(Deny::new(
                            DenyCode::TooManyInFlight,
                            format!(
                                "agent `{}` holds its maximum of live MCP sessions: let one expire first",
                                adm.agent
                            ),
                        )),
                    ));
                }
                // Already bound (a server reusing an id): the owner stays.
                log::warn!(
                    "request {}: MCP server `{}` reused a session id",
                    adm.request_id,
                    self.server
                )
            }
            // Unbound, the session is refused later (fail closed).
            Err(e) => log::warn!("request {}: session not bound: {e}", adm.request_id),
        }
        Ok(())
    }
}
