//! Model routes (`routes:`) and the model catalog (`models:`): which
//! providers serve a model, with what retry budget and output field.

use super::prices::{build_prices, PriceTable};
use super::providers::Provider;
use super::runtime::{list, Errs};
use super::spec::{self, ProviderKind};
use loopgate_policy::output::openai_needs_max_completion_tokens;
use loopgate_policy::{Endpoint, LimitField, NamePattern, Price, TargetOutput, Usage};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub struct Target {
    pub provider: Arc<Provider>,
    pub weight: u32,
    /// Model name sent to this provider instead of the requested one.
    pub model: Option<String>,
    /// The field this target reads a chat completion's output limit from
    /// (its own setting, else its route's).
    pub chat_limit_field: Option<LimitField>,
}

#[derive(Debug)]
pub struct Route {
    /// In fallback order.
    pub targets: Vec<Target>,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// No attempt starts after this long.
    pub max_total: Duration,
    /// The config's model settings (shared by every route of a snapshot),
    /// so each attempt judges its target with the config that admitted it.
    pub models: Arc<ModelCatalog>,
    /// Some target speaks Anthropic Messages / the OpenAI API: a chat
    /// call to a target of the other family is translated
    /// (`loopgate-translate`, [`Route::translates`]).
    pub has_anthropic: bool,
    pub has_openai: bool,
}

impl Route {
    /// Whether a call on `endpoint` may reach a target of the other API
    /// family (translated). `false` for a route whose targets all speak the
    /// agent's API: the pass-through path, with nothing added.
    pub fn translates(&self, endpoint: Endpoint) -> bool {
        match endpoint {
            Endpoint::ChatCompletions => self.has_anthropic,
            Endpoint::Messages => self.has_openai,
            _ => false,
        }
    }

    /// What target `i` accepts as the output limit of a call to `model`
    /// (the name it is sent), on `endpoint`, when the agent named `named`;
    /// `None` for an endpoint without output. The field: for chat
    /// completions the target's (or route's) setting, else the model's,
    /// else `max_completion_tokens` for OpenAI's reasoning models on
    /// `kind: openai`, else `max_tokens`; the endpoint's own field
    /// elsewhere.
    pub fn target_output(
        &self,
        i: usize,
        endpoint: Endpoint,
        model: &str,
        named: &str,
    ) -> Option<TargetOutput> {
        let target = self.targets.get(i)?;
        let info = self.models.find(model);
        let field = match endpoint {
            Endpoint::ChatCompletions => target
                .chat_limit_field
                .or(info.and_then(|m| m.chat_limit_field))
                .unwrap_or(
                    if target.provider.kind == ProviderKind::Openai
                        && openai_needs_max_completion_tokens(model)
                    {
                        LimitField::MaxCompletionTokens
                    } else {
                        LimitField::MaxTokens
                    },
                ),
            _ => LimitField::from_name(endpoint.max_tokens_field()?)?,
        };
        Some(TargetOutput {
            field,
            max_output: info.and_then(|m| m.max_output_tokens),
            clamp_asked: model != named || info.is_some_and(|m| m.clamp_requested),
        })
    }

    /// The model name target `i` is sent for an agent's `model`.
    pub fn sent_model<'a>(&'a self, i: usize, model: &'a str) -> &'a str {
        self.targets
            .get(i)
            .and_then(|t| t.model.as_deref())
            .unwrap_or(model)
    }

    /// The price target `i` charges for `model` (the agent's name): its
    /// provider's `price:`, else the catalog's for the name it is sent.
    fn target_price(&self, i: usize, model: &str) -> Option<Price> {
        let target = self.targets.get(i)?;
        target.provider.price.or_else(|| {
            self.models
                .prices
                .price(self.sent_model(i, model))
                .map(|(_, p)| p)
        })
    }

    /// The price `served_by` charged for `model` (the agent's name).
    pub fn price_of(&self, served_by: &str, model: &str) -> Option<Price> {
        let i = self
            .targets
            .iter()
            .position(|t| &*t.provider.name == served_by)?;
        self.target_price(i, model)
    }

    /// Whether some target has a price for `model` (the agent's name).
    pub fn priced(&self, model: &str) -> bool {
        (0..self.targets.len()).any(|i| self.target_price(i, model).is_some())
    }

    /// What a call for `model` costs at most, whichever target serves it:
    /// every target's price, field by field the dearest. `Err` names the
    /// first model (as sent) without a price.
    pub fn call_price<'a>(&'a self, model: &'a str) -> Result<Price, &'a str> {
        let mut dearest = Price::default();
        for i in 0..self.targets.len() {
            match self.target_price(i, model) {
                Some(p) => dearest = dearest.max(p),
                None => return Err(self.sent_model(i, model)),
            }
        }
        Ok(dearest)
    }

    /// The prices of the targets that have one, the dearest field by field
    /// (`on_unknown_price: zero`: a target without a price counts 0).
    pub fn known_price(&self, model: &str) -> Price {
        (0..self.targets.len())
            .filter_map(|i| self.target_price(i, model))
            .fold(Price::default(), Price::max)
    }

    /// The first model (as sent, or the `prefix*` of names sent) that a
    /// call for names matching `reach` may go to without a price; `None`
    /// when every target prices every such name (its provider's `price:`,
    /// a renamed target's model, or a catalog `prefix*` entry covering all
    /// the names under a prefix).
    pub fn unpriced(&self, reach: &NamePattern) -> Option<String> {
        let prices = &self.models.prices;
        self.targets.iter().find_map(|t| {
            if t.provider.price.is_some() {
                return None;
            }
            match (&t.model, reach) {
                (Some(m), _) => prices.price(m).is_none().then(|| m.clone()),
                (None, NamePattern::Exact(n)) => prices.price(n).is_none().then(|| n.clone()),
                (None, NamePattern::Prefix(p)) => {
                    (!prices.prices_all_under(p)).then(|| reach.as_config())
                }
            }
        })
    }

    /// What `usage` cost when `served_by` answered a call for `model` (the
    /// agent's name) on this route, in dollars, with the metrics label for
    /// the model: the catalog's name for the model sent, else the route's
    /// name `route_label` (a provider price on a model the catalog does not
    /// know). `None` when the price is unknown.
    pub fn cost<'a>(
        &'a self,
        served_by: &str,
        model: &'a str,
        route_label: &'a str,
        usage: &Usage,
    ) -> Option<(&'a str, f64)> {
        let i = self
            .targets
            .iter()
            .position(|t| &*t.provider.name == served_by)?;
        let sent = self.sent_model(i, model);
        let prices = &self.models.prices;
        let (label, price) = match self.targets[i].provider.price {
            Some(p) => (prices.label(sent).map_or(route_label, |l| l.as_ref()), p),
            None => {
                let (label, p) = prices.price(sent)?;
                (label.as_ref(), p)
            }
        };
        Some((label, price.cost(usage)))
    }
}

/// What the config says of one model (`models:`).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub max_output_tokens: Option<u64>,
    pub chat_limit_field: Option<LimitField>,
    pub clamp_requested: bool,
}

/// Model settings by the name sent upstream: exact names first, then the
/// longest matching prefix.
#[derive(Debug, Default)]
pub struct ModelCatalog {
    exact: HashMap<String, ModelInfo, ahash::RandomState>,
    /// Longest first.
    prefixes: Vec<(String, ModelInfo)>,
    /// Prices and context windows: the built-in catalog under the config's.
    pub prices: PriceTable,
}

impl ModelCatalog {
    pub fn find(&self, model: &str) -> Option<&ModelInfo> {
        self.exact.get(model).or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| model.starts_with(p.as_str()))
                .map(|(_, m)| m)
        })
    }
}

pub(super) fn chat_limit_field(f: spec::ChatLimitField) -> LimitField {
    match f {
        spec::ChatLimitField::MaxTokens => LimitField::MaxTokens,
        spec::ChatLimitField::MaxCompletionTokens => LimitField::MaxCompletionTokens,
    }
}

pub(super) fn build_models(
    errs: &mut Errs,
    models: &std::collections::BTreeMap<String, spec::ModelSpec>,
) -> ModelCatalog {
    let mut catalog = ModelCatalog {
        prices: build_prices(errs, models),
        ..ModelCatalog::default()
    };
    for (name, m) in models {
        let at = format!("models.{name}");
        if m.max_output_tokens == Some(0) {
            errs.push(format!("{at}.max_output_tokens"), "must be at least 1");
        }
        if m.clamp_requested == Some(true) && m.max_output_tokens.is_none() {
            errs.push(
                format!("{at}.clamp_requested"),
                "needs max_output_tokens: there is nothing to clamp to",
            );
        }
        let info = ModelInfo {
            max_output_tokens: m.max_output_tokens.filter(|&n| n > 0),
            chat_limit_field: m.max_tokens_field.map(chat_limit_field),
            clamp_requested: m.clamp_requested.unwrap_or(false),
        };
        match NamePattern::parse(name) {
            Ok(NamePattern::Exact(n)) => {
                catalog.exact.insert(n, info);
            }
            Ok(NamePattern::Prefix(p)) => catalog.prefixes.push((p, info)),
            Err(why) => errs.push(at, why),
        }
    }
    catalog
        .prefixes
        .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    catalog
}

/// Model name to route: exact names first, then the longest matching prefix.
#[derive(Debug, Default)]
pub struct Routes {
    /// ahash: looked up with an agent's model name on every request.
    pub(super) exact: HashMap<String, Arc<Route>, ahash::RandomState>,
    /// (prefix, its `prefix*` label, route)
    pub(super) prefixes: Vec<(String, Arc<str>, Arc<Route>)>,
}

impl Routes {
    /// The route for `model`, with the config's name for it (the model
    /// itself, or the `prefix*` that matched): a bounded metrics label.
    pub fn find(&self, model: &str) -> Option<(&str, &Arc<Route>)> {
        if let Some((name, r)) = self.exact.get_key_value(model) {
            return Some((name.as_str(), r));
        }
        self.prefixes
            .iter()
            .find(|(p, _, _)| model.starts_with(p.as_str()))
            .map(|(_, label, r)| (label.as_ref(), r))
    }

    /// The routes calls for names matching `allowed` (an agent's model
    /// pattern) may take, each with the names that reach it: an exact
    /// route whose name it allows; a `prefix*` route under an exact name
    /// it routes (the name), or under an allowed prefix (the longer of the
    /// two prefixes: an over-approximation where a longer route shadows
    /// part of it).
    pub fn reachable(&self, allowed: &NamePattern) -> Vec<(String, NamePattern, &Arc<Route>)> {
        let mut out = Vec::new();
        if let NamePattern::Exact(a) = allowed {
            if let Some((label, r)) = self.find(a) {
                out.push((label.to_string(), allowed.clone(), r));
            }
            return out;
        }
        for (name, r) in &self.exact {
            if allowed.matches(name) {
                out.push((name.clone(), NamePattern::Exact(name.clone()), r));
            }
        }
        let NamePattern::Prefix(a) = allowed else {
            return out;
        };
        for (p, label, r) in &self.prefixes {
            let reach = if p.starts_with(a.as_str()) {
                p
            } else if a.starts_with(p.as_str()) {
                a
            } else {
                continue;
            };
            out.push((label.to_string(), NamePattern::Prefix(reach.clone()), r));
        }
        out
    }

    /// The model names (and `prefix*` forms) with a route.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        let mut v: Vec<String> = self.exact.keys().cloned().collect();
        v.extend(self.prefixes.iter().map(|(_, label, _)| label.to_string()));
        v.sort();
        v.into_iter()
    }
}

/// Builds the routes under `routes:` over the providers that were built
/// (`defined` are the ones written, so a provider with its own error is not
/// reported again as unknown).
pub(super) fn build_routes(
    errs: &mut Errs,
    specs: &[spec::RouteSpec],
    defined: &BTreeMap<String, spec::ProviderSpec>,
    providers: &HashMap<String, Arc<Provider>>,
    models: &Arc<ModelCatalog>,
) -> Routes {
    let mut routes = Routes::default();
    let mut seen_models: HashSet<String> = HashSet::new();
    for (i, r) in specs.iter().enumerate() {
        let at = format!("routes[{i}]");
        if r.models.is_empty() {
            errs.push(format!("{at}.models"), "at least one model is required");
        }
        if r.targets.is_empty() {
            errs.push(format!("{at}.targets"), "at least one target is required");
        }
        let mut targets = Vec::new();
        for (j, t) in r.targets.iter().enumerate() {
            let weight = t.weight.unwrap_or(1);
            if weight == 0 {
                errs.push(format!("{at}.targets[{j}].weight"), "must be at least 1");
            }
            if t.model
                .as_deref()
                .is_some_and(|m| m.is_empty() || m.contains('*'))
            {
                errs.push(format!("{at}.targets[{j}].model"), "must be a model name");
            }
            let field = t.max_tokens_field.or(r.max_tokens_field);
            match providers.get(&t.provider) {
                Some(p) if p.kind == ProviderKind::Anthropic && field.is_some() => {
                    let at = match t.max_tokens_field {
                        Some(_) => format!("{at}.targets[{j}].max_tokens_field"),
                        None => format!("{at}.max_tokens_field"),
                    };
                    errs.push(
                        at,
                        format!(
                            "provider `{}` is anthropic, which reads only `max_tokens`: \
                             the setting is for chat completions on OpenAI-style providers",
                            t.provider
                        ),
                    );
                }
                Some(p) => targets.push(Target {
                    provider: p.clone(),
                    weight: weight.max(1),
                    model: t.model.clone(),
                    chat_limit_field: field.map(chat_limit_field),
                }),
                None if defined.contains_key(&t.provider) => {} // error already reported
                None => errs.push(
                    format!("{at}.targets[{j}].provider"),
                    format!(
                        "unknown provider `{}` (defined: {})",
                        t.provider,
                        list(defined.keys())
                    ),
                ),
            }
        }
        // Targets may speak either API family: chat calls are translated
        // for a target of the other one (README, "Provider families").
        let has_anthropic = targets
            .iter()
            .any(|t| t.provider.kind == ProviderKind::Anthropic);
        let has_openai = targets
            .iter()
            .any(|t| t.provider.kind != ProviderKind::Anthropic);
        let retry = r.retry.as_ref();
        let max_attempts = retry
            .and_then(|r| r.max_attempts)
            .unwrap_or(targets.len().max(1) as u32);
        if max_attempts == 0 || max_attempts > 10 {
            errs.push(
                format!("{at}.retry.max_attempts"),
                "must be between 1 and 10",
            );
        }
        let max_total_ms = retry.and_then(|r| r.max_total_ms).unwrap_or(60_000);
        if max_total_ms == 0 {
            errs.push(format!("{at}.retry.max_total_ms"), "must be at least 1");
        }
        let route = Arc::new(Route {
            targets,
            max_attempts: max_attempts.clamp(1, 10),
            max_total: Duration::from_millis(max_total_ms),
            models: models.clone(),
            has_anthropic,
            has_openai,
        });
        for (j, m) in r.models.iter().enumerate() {
            let path = format!("{at}.models[{j}]");
            if !seen_models.insert(m.clone()) {
                errs.push(path, format!("model `{m}` is routed twice"));
                continue;
            }
            match NamePattern::parse(m) {
                Ok(NamePattern::Exact(name)) => {
                    routes.exact.insert(name, route.clone());
                }
                Ok(NamePattern::Prefix(p)) => {
                    let label: Arc<str> = Arc::from(format!("{p}*"));
                    routes.prefixes.push((p, label, route.clone()))
                }
                Err(why) => errs.push(path, why),
            }
        }
    }
    // Longest prefix first, so `gpt-4o-mini*` wins over `gpt-4o*`.
    routes
        .prefixes
        .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    routes
}
