//! Exchange features: each one a module that owns its per-request state
//! and reacts to the phases of the upstream exchange through [`Feature`]
//! (Pingora's `HttpModule` and agentgateway's phase traits are the
//! models). The Pingora hooks call [`Features`] and know none of them.
//!
//! A feature is armed once, from the admission, in the context that talks
//! to the upstream (the large-body subrequest's, when there is one), and
//! is `None` for requests it does not concern: those pay nothing.
//!
//! Adding a feature: write its module here, implement [`Feature`], and add
//! one line to the `features!` list at the bottom of this file.

use super::ctx::Admission;
use super::env::Env;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::Error;
use std::time::Duration;

/// How the exchange ended, for [`Feature::done`].
pub struct End<'a> {
    /// The error the request ended with, if any.
    pub error: Option<&'a Error>,
    /// The status the upstream answered with, if it did.
    pub upstream_status: Option<u16>,
    /// A request went to the upstream (it may have acted).
    pub sent: bool,
    /// The whole request, as the agent saw it.
    pub elapsed: Duration,
    /// The usage the provider reported, and which provider answered.
    pub usage: Option<loopgate_policy::Usage>,
    pub served_by: Option<&'a str>,
}

/// One exchange feature. Every phase has a default that does nothing.
pub(crate) trait Feature: Sized + Send {
    /// The feature's state for this admitted request, or `None` when the
    /// request is none of its business.
    fn arm(adm: &Admission) -> Option<Self>;

    /// The header of the upstream answer that will be relayed (fallbacks
    /// were decided before).
    fn upstream_header(&mut self, _env: &Env<'_>, _adm: &Admission, _resp: &ResponseHeader) {}

    /// The response header going to the agent, which it may change.
    async fn response_header(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        _resp: &mut ResponseHeader,
    ) -> pingora::Result<()> {
        Ok(())
    }

    /// A chunk of the upstream's body, as received. An error ends the
    /// exchange (its cause is the answer).
    fn upstream_body(
        &mut self,
        _env: &Env<'_>,
        _adm: &Admission,
        _body: Option<&Bytes>,
        _end: bool,
    ) -> pingora::Result<()> {
        Ok(())
    }

    /// A chunk going to the agent, which it may change.
    fn response_body(
        &mut self,
        _adm: &Admission,
        _body: &mut Option<Bytes>,
        _end: bool,
    ) -> pingora::Result<()> {
        Ok(())
    }

    /// The exchange ended (`logging`).
    async fn done(&mut self, _env: &Env<'_>, _adm: &Admission, _end: &End<'_>) {}
}

/// Declares the features: each `name => Type` line loads module `name`,
/// adds a field `name: Option<name::Type>` and a call in every phase, in
/// the order listed.
/// A feature rewrites this answer's body: it no longer has the
/// upstream's length, so it goes chunked.
fn rewritten_length(resp: &mut ResponseHeader) -> pingora::Result<()> {
    resp.remove_header(&http::header::CONTENT_LENGTH);
    resp.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
    Ok(())
}

macro_rules! features {
    ($($name:ident => $ty:ident),* $(,)?) => {
        $(pub mod $name;)*

        /// The features armed for one request.
        #[derive(Debug, Default)]
        pub struct Features {
            $(pub $name: Option<$name::$ty>,)*
        }

        impl Features {
            pub fn arm(adm: &Admission) -> Features {
                Features { $($name: <$name::$ty as Feature>::arm(adm),)* }
            }

            pub fn upstream_header(&mut self, env: &Env<'_>, adm: &Admission, resp: &ResponseHeader) {
                $(if let Some(f) = self.$name.as_mut() { f.upstream_header(env, adm, resp); })*
            }

            pub async fn response_header(
                &mut self,
                env: &Env<'_>,
                adm: &Admission,
                resp: &mut ResponseHeader,
            ) -> pingora::Result<()> {
                $(if let Some(f) = self.$name.as_mut() { f.response_header(env, adm, resp).await?; })*
                Ok(())
            }

            pub fn upstream_body(
                &mut self,
                env: &Env<'_>,
                adm: &Admission,
                body: Option<&Bytes>,
                end: bool,
            ) -> pingora::Result<()> {
                $(if let Some(f) = self.$name.as_mut() { f.upstream_body(env, adm, body, end)?; })*
                Ok(())
            }

            pub fn response_body(
                &mut self,
                adm: &Admission,
                body: &mut Option<Bytes>,
                end: bool,
            ) -> pingora::Result<()> {
                $(if let Some(f) = self.$name.as_mut() { f.response_body(adm, body, end)?; })*
                Ok(())
            }

            pub async fn done(&mut self, env: &Env<'_>, adm: &Admission, end: &End<'_>) {
                $(if let Some(f) = self.$name.as_mut() { f.done(env, adm, end).await; })*
            }
        }
    };
}

features! {
    usage => UsageMeter,
    translate => Translate,
    json_check => JsonCheck,
    idempotency => Recorder,
    mcp_session => SessionBinding,
    mcp_lists => ListFilter,
    mcp_stream => ServerStream,
    tool_streak => Streak,
    task_latency => TaskLatency,
    spend_fit => SpendFit,
}
