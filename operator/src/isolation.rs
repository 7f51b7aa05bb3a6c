//! Compiling a namespace so that one invalid resource does not hold the rest back.
//!
//! A resource at fault is compiled out and the others publish. In its place goes the version
//! of it this process last published, when there is one, so that a bad edit does not take a
//! model, key or tier away from clients; otherwise it is left out. Replacing or leaving one
//! out can make another invalid (an `auto` route whose candidate it was, a tier now missing),
//! so this repeats until what remains compiles. Problems that no single resource owns (no
//! Tier declares `free`) still block publication: the gateways keep the last good config.
//!
//! The operator reads only the Secrets it is pointed at (`--secret`), so that its RBAC can
//! name them: a resource referring to any other is at fault for that reason, said as such,
//! rather than for a Secret "not found" that may well exist.

use std::collections::{BTreeMap, BTreeSet};

use crds::compile::{compile as compile_set, CompileErrors, ResourceRef};
use crds::config::GatewayConfig;
use crds::resources::{ApiKey, ModelRoute, Tier};
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;

/// What became of a resource at fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Its last published version is compiled in its place.
    KeptLastGood,
    /// It is not in the compiled config at all.
    LeftOut,
}

/// A resource at fault: its own problems (those of the version applied) and its fate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub problems: Vec<String>,
    pub fate: Fate,
}

pub struct Isolated {
    /// The config of what remains, or the problems no resource owns.
    pub compiled: Result<GatewayConfig, CompileErrors>,
    pub faults: BTreeMap<ResourceRef, Fault>,
    /// The resources compiled into the config (the last good versions of the faulty), to
    /// remember once it is published.
    pub kept: LastGood,
}

/// The versions of each resource in the config this process last published.
#[derive(Default)]
pub struct LastGood {
    tiers: BTreeMap<ResourceRef, Tier>,
    routes: BTreeMap<ResourceRef, ModelRoute>,
    keys: BTreeMap<ResourceRef, ApiKey>,
}

/// The problem of a resource referring to Secret `name`, which the operator does not read.
pub fn unreadable(name: &str) -> String {
    format!(
        "Secret {name} is not one the operator reads: add it to its --secret flags (the \
         chart's operator.secrets) and to its Role"
    )
}

/// The Secrets `route` refers to.
pub fn route_secrets(route: &ModelRoute) -> impl Iterator<Item = &str> {
    route.spec.upstreams.iter().flat_map(|upstream| {
        let api_key = upstream
            .api_key_secret_ref
            .as_ref()
            .map(|r| r.name.as_str());
        let aws = upstream
            .aws_credentials_secret_ref
            .as_ref()
            .map(|r| r.name.as_str());
        let google = upstream
            .google_credentials_secret_ref
            .as_ref()
            .map(|r| r.name.as_str());
        api_key.into_iter().chain(aws).chain(google)
    })
}

/// The Secrets `key` refers to.
pub fn key_secrets(key: &ApiKey) -> impl Iterator<Item = &str> {
    key.spec
        .seed
        .as_ref()
        .map(|seed| seed.secret_ref.name.as_str())
        .into_iter()
}

/// Compiles what remains once the resources at fault are out; `readable` are the Secrets the
/// operator reads (`secrets` holds those of them that exist).
pub fn compile(
    tiers: &[Tier],
    routes: &[ModelRoute],
    keys: &[ApiKey],
    secrets: &[Secret],
    readable: &BTreeSet<String>,
    last: &LastGood,
) -> Isolated {
    let mut tiers = Inputs::new("Tier", tiers);
    let mut routes = Inputs::new("ModelRoute", routes);
    let mut keys = Inputs::new("ApiKey", keys);
    let mut faults: BTreeMap<ResourceRef, Fault> = BTreeMap::new();
    // A fallback that refers to an unreadable Secret too fails the compile below ("not
    // found"), and is then left out with this first problem kept.
    let refused = |names: Vec<&str>| -> Vec<String> {
        names
            .into_iter()
            .filter(|name| !readable.contains(*name))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(unreadable)
            .collect()
    };
    let mut refusals = Vec::new();
    for (resource, route, _) in &routes.items {
        let problems = refused(route_secrets(route).collect());
        if !problems.is_empty() {
            refusals.push((resource.clone(), problems));
        }
    }
    for (resource, key, _) in &keys.items {
        let problems = refused(key_secrets(key).collect());
        if !problems.is_empty() {
            refusals.push((resource.clone(), problems));
        }
    }
    for (resource, problems) in refusals {
        let fate = routes
            .fall_back(&resource, &last.routes)
            .or_else(|| keys.fall_back(&resource, &last.keys))
            .unwrap_or(Fate::LeftOut);
        faults.insert(resource, Fault { problems, fate });
    }
    loop {
        let compiled = compile_set(
            &tiers.current(),
            &routes.current(),
            &keys.current(),
            secrets,
        );
        let owned = match &compiled {
            Ok(_) => BTreeMap::new(),
            Err(errors) => {
                let mut owned: BTreeMap<ResourceRef, Vec<String>> = BTreeMap::new();
                for error in &errors.errors {
                    if let Some(resource) = &error.resource {
                        owned
                            .entry(resource.clone())
                            .or_default()
                            .push(error.message.clone());
                    }
                }
                owned
            }
        };
        if owned.is_empty() {
            let kept = LastGood {
                tiers: tiers.kept(),
                routes: routes.kept(),
                keys: keys.kept(),
            };
            return Isolated {
                compiled,
                faults,
                kept,
            };
        }
        for (resource, problems) in owned {
            let fate = tiers
                .fall_back(&resource, &last.tiers)
                .or_else(|| routes.fall_back(&resource, &last.routes))
                .or_else(|| keys.fall_back(&resource, &last.keys))
                .unwrap_or(Fate::LeftOut);
            // The problems shown are those of the version applied, not of a fallback.
            faults
                .entry(resource)
                .and_modify(|fault| fault.fate = fate)
                .or_insert(Fault { problems, fate });
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Applied,
    LastGood,
    Out,
}

/// One kind's resources, each as applied, replaced by its last good version, or out.
struct Inputs<K> {
    items: Vec<(ResourceRef, K, State)>,
}

impl<K: Resource + Clone> Inputs<K> {
    fn new(kind: &'static str, objects: &[K]) -> Self {
        Self {
            items: objects
                .iter()
                .map(|o| (ResourceRef::new(kind, o.meta()), o.clone(), State::Applied))
                .collect(),
        }
    }

    fn current(&self) -> Vec<K> {
        self.items
            .iter()
            .filter(|(_, _, state)| *state != State::Out)
            .map(|(_, object, _)| object.clone())
            .collect()
    }

    fn kept(&self) -> BTreeMap<ResourceRef, K> {
        self.items
            .iter()
            .filter(|(_, _, state)| *state != State::Out)
            .map(|(resource, object, _)| (resource.clone(), object.clone()))
            .collect()
    }

    /// Replaces `resource` by its last good version the first time it is at fault, leaves it
    /// out the next; `None` when it is not of this kind.
    fn fall_back(
        &mut self,
        resource: &ResourceRef,
        last: &BTreeMap<ResourceRef, K>,
    ) -> Option<Fate> {
        let (_, object, state) = self.items.iter_mut().find(|(r, _, _)| r == resource)?;
        match (*state, last.get(resource)) {
            (State::Applied, Some(good)) => {
                *object = good.clone();
                *state = State::LastGood;
                Some(Fate::KeptLastGood)
            }
            _ => {
                *state = State::Out;
                Some(Fate::LeftOut)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crds::manifests::{read_dir, Manifests};

    use super::*;

    fn standalone() -> Manifests {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/standalone");
        read_dir(&dir).unwrap_or_else(|e| panic!("{e}"))
    }

    fn route_ref(name: &str) -> ResourceRef {
        ResourceRef {
            kind: "ModelRoute",
            namespace: None,
            name: name.to_owned(),
        }
    }

    /// svc-haiku edited to route nowhere (neither upstreams nor auto).
    fn with_haiku_broken(mut manifests: Manifests) -> Manifests {
        for route in &mut manifests.routes {
            if route.metadata.name.as_deref() == Some("svc-haiku") {
                route.spec.upstreams.clear();
            }
        }
        manifests
    }

    /// Compiles `m` as an operator pointed at every Secret of the folder would.
    fn run(m: &Manifests, last: &LastGood) -> Isolated {
        let readable = m
            .secrets
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        compile(&m.tiers, &m.routes, &m.keys, &m.secrets, &readable, last)
    }

    #[test]
    fn an_invalid_route_never_published_is_left_out_with_what_needed_it_and_the_rest_compiles() {
        let outcome = run(&with_haiku_broken(standalone()), &LastGood::default());
        let config = outcome.compiled.unwrap_or_else(|e| panic!("{e}"));
        assert!(!config.models.contains_key("svc/haiku"));
        assert!(config.models.contains_key("svc/opus"));
        let haiku = &outcome.faults[&route_ref("svc-haiku")];
        assert_eq!(haiku.fate, Fate::LeftOut);
        assert!(
            haiku.problems[0].contains("neither upstreams nor auto"),
            "{haiku:?}"
        );
        // svc/auto names svc/haiku among its candidates: it cannot compile without it.
        assert_eq!(outcome.faults[&route_ref("svc-auto")].fate, Fate::LeftOut);
        assert_eq!(outcome.faults.len(), 2, "{:?}", outcome.faults);
    }

    #[test]
    fn an_invalid_edit_of_a_published_route_keeps_its_published_version_in_the_config() {
        let published = run(&standalone(), &LastGood::default());
        assert!(published.compiled.is_ok() && published.faults.is_empty());
        let outcome = run(&with_haiku_broken(standalone()), &published.kept);
        let config = outcome.compiled.unwrap_or_else(|e| panic!("{e}"));
        assert!(config.models.contains_key("svc/haiku"));
        assert!(config.models.contains_key("svc/auto"));
        assert_eq!(
            outcome.faults[&route_ref("svc-haiku")].fate,
            Fate::KeptLastGood
        );
        assert_eq!(outcome.faults.len(), 1, "{:?}", outcome.faults);
    }

    #[test]
    fn a_bedrock_routes_credentials_secret_is_one_the_operator_must_be_allowed_to_read() {
        let mut manifests = standalone();
        for route in &mut manifests.routes {
            if route.metadata.name.as_deref() == Some("svc-haiku") {
                let upstream = &mut route.spec.upstreams[0];
                upstream.provider = crds::resources::Provider::Bedrock;
                upstream.region = Some("eu-west-3".into());
                upstream.aws_credentials_secret_ref = Some(crds::resources::SecretRef {
                    name: "bedrock-keys".into(),
                });
                assert_eq!(route_secrets(route).collect::<Vec<_>>(), ["bedrock-keys"]);
            }
        }
        let outcome = run(&manifests, &LastGood::default());
        let haiku = &outcome.faults[&route_ref("svc-haiku")];
        assert_eq!(haiku.problems, [unreadable("bedrock-keys")], "{haiku:?}");
    }

    #[test]
    fn a_vertex_routes_service_account_secret_is_one_the_operator_must_be_allowed_to_read() {
        let mut manifests = standalone();
        for route in &mut manifests.routes {
            if route.metadata.name.as_deref() == Some("svc-haiku") {
                let upstream = &mut route.spec.upstreams[0];
                upstream.provider = crds::resources::Provider::Vertex;
                upstream.region = Some("us-east5".into());
                upstream.project = Some("acme-llm".into());
                upstream.api_key_secret_ref = None;
                upstream.google_credentials_secret_ref = Some(crds::resources::SecretKeyRef {
                    name: "vertex-sa".into(),
                    key: "key.json".into(),
                });
                assert_eq!(route_secrets(route).collect::<Vec<_>>(), ["vertex-sa"]);
            }
        }
        let outcome = run(&manifests, &LastGood::default());
        let haiku = &outcome.faults[&route_ref("svc-haiku")];
        assert_eq!(haiku.problems, [unreadable("vertex-sa")], "{haiku:?}");
    }

    #[test]
    fn a_problem_that_no_resource_owns_still_blocks_publication() {
        let mut manifests = standalone();
        manifests
            .tiers
            .retain(|t| t.metadata.name.as_deref() != Some("free"));
        let outcome = run(&manifests, &LastGood::default());
        let errors = outcome.compiled.err().map(|e| e.to_string());
        assert!(
            errors
                .as_deref()
                .is_some_and(|e| e.contains("no Tier declares tier free")),
            "{errors:?}"
        );
    }
}
