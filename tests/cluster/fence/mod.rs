//! The fences: Kubernetes objects fenced by the apiserver, and the PostgreSQL and Redis guards.

mod follow;
mod harness;
mod identity;
mod kube;
mod plain_controller;
mod policy_scope;
mod postgres;
mod redis;
mod security;
mod writers;
