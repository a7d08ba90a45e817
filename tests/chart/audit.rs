//! What a ServiceAccount was granted (its bindings, read from the apiserver) and what it used
//! (the apiserver's audit log, turned on by `FL_CP_AUDIT=1 hack/control-plane up`).

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::common::{control_plane, repo_root};

/// One permission: a verb on a resource (`pods`, `fencedleases/status`) of an API group, in
/// one namespace or (None) in all, on objects of these names only (a rule's `resourceNames`:
/// used when any of them is) or (None) on all.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub namespace: Option<String>,
    pub names: Option<Vec<String>>,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        let scope = self.namespace.as_deref().unwrap_or("all namespaces");
        write!(f, "{} {} ({group}) in {scope}", self.verb, self.resource)?;
        match &self.names {
            Some(names) => write!(f, " named {}", names.join(", ")),
            None => Ok(()),
        }
    }
}

/// One request the audit log recorded.
#[derive(Clone, Debug)]
pub struct Request {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uri: String,
    pub allowed: bool,
}

impl Request {
    fn uses(&self, p: &Permission) -> bool {
        self.allowed
            && self.group == p.group
            && self.resource == p.resource
            && self.verb == p.verb
            && (p.namespace.is_none() || p.namespace == self.namespace)
            && p.names
                .as_ref()
                .is_none_or(|names| self.name.as_ref().is_some_and(|n| names.contains(n)))
    }
}

/// The audit log of the test control plane; turns it on (restarting the apiserver in place,
/// once) when the running control plane was started without it.
pub fn log_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = control_plane()
            .kubeconfig
            .parent()
            .expect("kubeconfig directory")
            .to_path_buf();
        if !dir.join("audit-policy.yaml").exists() {
            let out = Command::new(repo_root().join("hack/control-plane"))
                .arg("up")
                .env("FL_CP_DIR", &dir)
                .env("FL_CP_AUDIT", "1")
                .output()
                .expect("hack/control-plane up");
            assert!(
                out.status.success(),
                "turning on the audit log: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // A restarted apiserver's admission learns the claim's schema anew.
            control_plane().install_crds();
        }
        dir.join("audit.log")
    })
}

/// Every event of the audit log, as it has them now.
pub fn events() -> Vec<Value> {
    let text = std::fs::read_to_string(log_path()).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect()
}

/// Every request `username` made, as the audit log has it now.
pub fn requests_by(username: &str) -> Vec<Request> {
    events()
        .into_iter()
        .filter(|e| e["user"]["username"] == username)
        .filter_map(|e| {
            let o = e.get("objectRef")?;
            let mut resource = o["resource"].as_str()?.to_string();
            if let Some(sub) = o["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            Some(Request {
                group: o["apiGroup"].as_str().unwrap_or_default().into(),
                resource,
                verb: e["verb"].as_str()?.into(),
                namespace: o["namespace"].as_str().map(String::from),
                name: o["name"].as_str().map(String::from),
                uri: e["requestURI"].as_str().unwrap_or_default().into(),
                allowed: e["annotations"]["authorization.k8s.io/decision"] == "allow",
            })
        })
        .collect()
}

/// Requests the authorizer refused.
pub fn forbidden(requests: &[Request]) -> Vec<String> {
    let refused: BTreeSet<_> = requests
        .iter()
        .filter(|r| !r.allowed)
        .map(|r| format!("{} {}", r.verb, r.uri))
        .collect();
    refused.into_iter().collect()
}

/// Verbs no request carries: the admission policies ask the authorizer for them
/// (deploy/admission/), so the audit log never shows them used.
const ADMISSION_VERBS: [&str; 2] = ["override", "operate"];

/// Granted permissions no request used.
pub fn unused(granted: &[Permission], requests: &[Request]) -> Vec<Permission> {
    granted
        .iter()
        .filter(|p| !ADMISSION_VERBS.contains(&p.verb.as_str()))
        .filter(|p| !requests.iter().any(|r| r.uses(p)))
        .cloned()
        .collect()
}

fn kubectl_json(args: &[&str]) -> Value {
    let out = control_plane()
        .kubectl_cmd()
        .args(args)
        .args(["-o", "json"])
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl JSON")
}

/// Every permission ServiceAccount `namespace/name` holds through RBAC bindings (those of the
/// cluster's own roles, which every authenticated user gets, aside), expanded one verb, one
/// resource, one namespace at a time.
pub fn granted_to(namespace: &str, name: &str) -> Vec<Permission> {
    let bindings = kubectl_json(&["get", "clusterrolebindings,rolebindings", "-A"]);
    let mut granted = BTreeSet::new();
    for b in bindings["items"].as_array().into_iter().flatten() {
        let names_it = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace
        });
        if !names_it {
            continue;
        }
        let scope = b["metadata"]["namespace"].as_str();
        let role = &b["roleRef"];
        let role_name = role["name"].as_str().expect("roleRef name");
        let role = match (role["kind"].as_str(), scope) {
            (Some("ClusterRole"), _) => kubectl_json(&["get", "clusterrole", role_name]),
            (Some("Role"), Some(ns)) => kubectl_json(&["get", "role", role_name, "-n", ns]),
            other => panic!("unexpected roleRef {other:?}"),
        };
        for rule in role["rules"].as_array().into_iter().flatten() {
            let list = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "rules by URL are not expected: {rule}"
            );
            let names = rule.get("resourceNames").map(|_| {
                let mut names = list("resourceNames");
                names.sort();
                names
            });
            for group in list("apiGroups") {
                for resource in list("resources") {
                    for verb in list("verbs") {
                        granted.insert(Permission {
                            group: group.clone(),
                            resource: resource.clone(),
                            verb,
                            namespace: scope.map(String::from),
                            names: names.clone(),
                        });
                    }
                }
            }
        }
    }
    granted.into_iter().collect()
}

pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// A table of permissions, one a line, for failure messages and the test log.
pub fn table(permissions: &[Permission]) -> String {
    permissions.iter().map(|p| format!("  {p}\n")).collect()
}
