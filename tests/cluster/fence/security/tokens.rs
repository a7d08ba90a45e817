//! Tokens within 2^53 − 1, which every shipped fence compares exactly.

use super::*;

/// Issue 38, item 7 (I13): tokens stay within 2^53 − 1, the bound every shipped fence compares
/// exactly. `minToken: 10^18` is refused 422 naming `spec.minToken`; `minToken: 2^52` is
/// accepted, its first grant's token is 2^52 + 1, which the object policy accepts on an object
/// the holder stamps; a stamp of 2^53 is refused 422 as malformed.
#[tokio::test]
async fn tokens_stay_within_two_to_the_53() {
    let ns = TestNamespace::new("sec-tokens").await;
    ns.with_fence_policies().await;
    let _op = OperatorProcess::start(&ns.name, &[]);
    let pods = ns.app_pods(&["pa"]).await;
    let pa = &pods[0];

    let mut findings = Findings::default();
    let huge = create_lease_as(
        &ns.client,
        &ns.name,
        "huge",
        json!({"minToken": 1_000_000_000_000_000_000_i64}),
    )
    .await;
    match refusal(&huge) {
        Some((code, message)) => findings.check(
            code == 422 && message.contains("spec.minToken"),
            || format!("minToken 10^18 was refused, but not as an invalid spec.minToken: {code} {message}"),
        ),
        None => findings.check(false, || {
            format!("a lease with minToken 10^18 was {}", describe(&huge))
        }),
    }

    create_lease_as(
        &ns.client,
        &ns.name,
        "books",
        json!({"leaseDurationSeconds": 30, "minToken": TWO_52, "fenceObjects": true}),
    )
    .await
    .expect("a lease with minToken 2^52 is accepted");
    claim_as_pod(&ns, pa, "books").await;
    let token = wait_for("pa granted", WAIT, || ns.granted_token("pa")).await;
    let _beat = ns.keep_beating("pa", Duration::from_secs(1));
    assert_eq!(token, TWO_52 + 1, "the first token above minToken 2^52");

    let as_pa: Api<ConfigMap> = Api::namespaced(ns.client_as_pod(pa).await, &ns.name);
    let stamped = accepted_within(WAIT, || {
        create_config_map(
            &as_pa,
            fenced_config_map("ledger", "books", &token.to_string(), "pa"),
        )
    })
    .await;
    findings.check(stamped.is_ok(), || {
        format!(
            "the holder's ConfigMap stamped {token} was refused: {}",
            stamped.as_ref().err().unwrap()
        )
    });
    let too_high = as_pa
        .create(
            &PostParams::default(),
            &fenced_config_map("too-high", "books", &TWO_53.to_string(), "pa"),
        )
        .await;
    match refusal(&too_high) {
        Some((code, message)) => findings
            .check(code == 422 && message.contains("fencing.dev/token"), || {
                format!("a stamp of 2^53 was refused, but not as malformed (422): {code} {message}")
            }),
        None => findings.check(false, || {
            format!(
                "the holder's ConfigMap stamped 2^53 = {TWO_53} was {}",
                describe(&too_high)
            )
        }),
    }
    findings.finish();
}

// ---- 8 ----
