//! Objects with only their metadata: what a deletion carries when all that is known of the
//! object is who it was (one that no longer decodes, or one a relist no longer lists).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ObjectMeta;
use kube::core::PartialObjectMeta;

use fenced_lease_api::{FencedLease, FencedLeaseClaim, FencedLeaseClaimSpec, FencedLeaseSpec};

/// An object with only its metadata: enough for a cache to forget it when it is deleted.
pub trait Skeleton {
    fn skeleton(metadata: ObjectMeta) -> Self;
}

impl Skeleton for FencedLease {
    fn skeleton(metadata: ObjectMeta) -> Self {
        let spec = FencedLeaseSpec {
            lease_duration_seconds: 15,
            min_token: 0,
            annotate_holder_pod: true,
            fence_objects: false,
            only_holder_writes: false,
            fence: None,
            follow: None,
        };
        FencedLease {
            metadata,
            spec,
            status: None,
        }
    }
}

impl Skeleton for FencedLeaseClaim {
    fn skeleton(metadata: ObjectMeta) -> Self {
        let spec = FencedLeaseClaimSpec {
            lease_name: String::new(),
            holder_identity: String::new(),
            pod_name: None,
            renew_time: None,
        };
        FencedLeaseClaim {
            metadata,
            spec,
            status: None,
        }
    }
}

impl Skeleton for Lease {
    fn skeleton(metadata: ObjectMeta) -> Self {
        Lease {
            metadata,
            spec: None,
        }
    }
}

impl Skeleton for PartialObjectMeta<Pod> {
    fn skeleton(metadata: ObjectMeta) -> Self {
        PartialObjectMeta {
            types: None,
            metadata,
            _phantom: std::marker::PhantomData,
        }
    }
}
