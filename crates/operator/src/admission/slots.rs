//! Which kinds slot fences which kind, where: a pure plan from the slots as stored and the
//! kinds the served leases name.
//!
//! A kind keeps the slot it has; a kind no served lease names any more leaves the namespaces
//! this operator serves (another operator, serving other namespaces, keeps its own), and a
//! slot fencing nowhere is free again; a kind new to the cluster takes the first free slot,
//! or, when none is free, stays unplaced: its leases are not granted (fail closed).

use std::collections::{BTreeMap, BTreeSet};

use super::shipped::Assignment;
use fenced_lease_api::FencedResource;

/// A slot as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Not installed (or not yet seen): it cannot be used.
    Missing,
    Unused,
    Assigned(Assignment),
}

/// The kinds the served leases fence, with the namespaces of the leases that fence each.
pub type Wanted = BTreeMap<FencedResource, BTreeSet<String>>;

/// What the slots should fence.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Each slot's assignment (`None`: unused), for every slot that is installed.
    pub slots: Vec<Option<Option<Assignment>>>,
    /// Kinds wanted that no slot is free for.
    pub unplaced: BTreeSet<FencedResource>,
}

/// Plans the slots for `wanted`, where `serves` tells the namespaces this operator answers for.
pub fn plan(current: &[Slot], wanted: &Wanted, serves: impl Fn(&str) -> bool) -> Plan {
    let mut placed: BTreeSet<&FencedResource> = BTreeSet::new();
    let mut next: Vec<Option<Option<Assignment>>> = current
        .iter()
        .map(|slot| match slot {
            Slot::Missing => None,
            Slot::Unused => Some(None),
            Slot::Assigned(a) => {
                let mut namespaces: BTreeSet<String> = a
                    .namespaces
                    .iter()
                    .filter(|ns| !serves(ns))
                    .cloned()
                    .collect();
                // The first slot of a kind is where its served namespaces go.
                if placed.insert(&a.kind) {
                    namespaces.extend(wanted.get(&a.kind).into_iter().flatten().cloned());
                }
                let kind = a.kind.clone();
                Some((!namespaces.is_empty()).then_some(Assignment { kind, namespaces }))
            }
        })
        .collect();
    let mut unplaced = BTreeSet::new();
    for (kind, namespaces) in wanted {
        if placed.contains(kind) || namespaces.is_empty() {
            continue;
        }
        match next.iter_mut().flatten().find(|slot| slot.is_none()) {
            Some(free) => {
                *free = Some(Assignment {
                    kind: kind.clone(),
                    namespaces: namespaces.clone(),
                })
            }
            None => {
                unplaced.insert(kind.clone());
            }
        }
    }
    Plan {
        slots: next,
        unplaced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(resource: &str) -> FencedResource {
        FencedResource {
            group: String::new(),
            resource: resource.into(),
        }
    }

    fn at(resource: &str, namespaces: &[&str]) -> Assignment {
        Assignment {
            kind: kind(resource),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn wanted(pairs: &[(&str, &[&str])]) -> Wanted {
        pairs
            .iter()
            .map(|(r, ns)| (kind(r), ns.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    #[test]
    fn a_kind_keeps_its_slot_and_a_new_kind_takes_the_first_free_one() {
        let current = [
            Slot::Unused,
            Slot::Assigned(at("configmaps", &["a"])),
            Slot::Missing,
            Slot::Unused,
        ];
        let p = plan(
            &current,
            &wanted(&[("configmaps", &["a", "b"]), ("secrets", &["c"])]),
            |_| true,
        );
        assert_eq!(
            p.slots,
            [
                Some(Some(at("secrets", &["c"]))),
                Some(Some(at("configmaps", &["a", "b"]))),
                None,
                Some(None),
            ]
        );
        assert!(p.unplaced.is_empty());
    }

    #[test]
    fn a_kind_no_lease_names_frees_its_slot_and_only_served_namespaces_are_touched() {
        let current = [Slot::Assigned(at("configmaps", &["a", "theirs"]))];
        let served = |ns: &str| ns != "theirs";
        assert_eq!(
            plan(&current, &Wanted::new(), served).slots,
            [Some(Some(at("configmaps", &["theirs"])))],
            "another operator's namespace stays"
        );
        assert_eq!(
            plan(&current, &Wanted::new(), |_| true).slots,
            [Some(None)],
            "free again"
        );
    }

    #[test]
    fn kinds_beyond_the_free_slots_are_unplaced_and_a_missing_slot_is_never_used() {
        let current = [Slot::Missing, Slot::Assigned(at("configmaps", &["a"]))];
        let p = plan(
            &current,
            &wanted(&[("configmaps", &["a"]), ("secrets", &["a"])]),
            |_| true,
        );
        assert_eq!(p.slots, [None, Some(Some(at("configmaps", &["a"])))]);
        assert_eq!(p.unplaced, [kind("secrets")].into());
    }

    #[test]
    fn a_kind_in_two_slots_gathers_in_the_first() {
        let current = [
            Slot::Assigned(at("configmaps", &["a"])),
            Slot::Assigned(at("configmaps", &["b"])),
        ];
        let p = plan(&current, &wanted(&[("configmaps", &["a", "b"])]), |_| true);
        assert_eq!(
            p.slots,
            [Some(Some(at("configmaps", &["a", "b"]))), Some(None)]
        );
    }
}
