//! What a holder's Role allows.

mod rbac;
