//! The krew plugin manifest (`.krew.yaml`, rendered by `hack/krew` as krew-release-bot renders
//! it) installs what `kubectl fence` is: the plugin `fence`, for the platform the archive is
//! built for, whose `bin` is the `kubectl-fence` executable in the archive, at the URI and
//! sha256 of that archive, with the completion helper and the license beside it.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `hack/krew` over the tests' own kubectl-fence: the archive and the rendered manifest.
fn render() -> (PathBuf, Value) {
    let root = common::repo_root();
    let out = std::env::temp_dir().join(format!("krew-manifest-{}", std::process::id()));
    run(Command::new(root.join("hack/krew"))
        .env("KREW_BIN", common::bin("kubectl-fence"))
        .env("KREW_OUT", &out)
        .env_remove("TAG"));
    let text = std::fs::read_to_string(out.join("fence.yaml")).expect("fence.yaml");
    let manifest = serde_saphyr::from_str(&text).expect("the manifest is YAML");
    (out, manifest)
}

#[test]
fn the_rendered_manifest_installs_the_archive_it_names() {
    let (out, m) = render();
    assert_eq!(
        m["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(m["kind"], "Plugin");
    // krew runs plugin `fence` as `kubectl fence`, through the executable `kubectl-fence`.
    assert_eq!(m["metadata"]["name"], "fence");
    let spec = &m["spec"];
    assert_eq!(spec["version"], format!("v{}", env!("CARGO_PKG_VERSION")));
    for field in ["homepage", "shortDescription", "description", "caveats"] {
        assert!(
            spec[field].as_str().is_some_and(|s| !s.trim().is_empty()),
            "spec.{field} is empty"
        );
    }

    let platforms = spec["platforms"].as_array().expect("platforms");
    assert_eq!(platforms.len(), 1, "one archive: linux/amd64");
    let p = &platforms[0];
    assert_eq!(
        p["selector"]["matchLabels"],
        serde_json::json!({"os": "linux", "arch": "amd64"})
    );
    let archive = out.join("kubectl-fence-linux-amd64.tar.gz");
    let uri = p["uri"].as_str().expect("uri");
    assert!(
        uri.starts_with("https://")
            && uri.ends_with(&format!(
                "/v{}/kubectl-fence-linux-amd64.tar.gz",
                env!("CARGO_PKG_VERSION")
            )),
        "{uri}"
    );
    let sha = run(Command::new("sha256sum").arg(&archive));
    assert_eq!(p["sha256"], sha.split_whitespace().next().unwrap());

    // Every file the manifest copies is in the archive, and `bin` is one of them.
    let listed = run(Command::new("tar").arg("-tzf").arg(&archive));
    let listed: Vec<&str> = listed.lines().collect();
    let files: Vec<&str> = p["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["from"].as_str().expect("from"))
        .collect();
    for f in &files {
        assert!(listed.contains(f), "{f} is not in the archive: {listed:?}");
    }
    assert_eq!(p["bin"], "kubectl-fence");
    for f in ["kubectl-fence", "kubectl_complete-fence", "LICENSE"] {
        assert!(
            files.contains(&f),
            "the manifest does not install {f}: {files:?}"
        );
    }

    // What it unpacks runs: the plugin says its version, the helper is executable.
    let unpacked = out.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&unpacked));
    let version = run(Command::new(unpacked.join("kubectl-fence")).arg("--version"));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    let reply = run(Command::new(unpacked.join("kubectl-fence")).args(["__complete", "rel"]));
    assert_eq!(reply, "release\n:4\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(unpacked.join("kubectl_complete-fence"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "kubectl_complete-fence is executable");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_release_tag_is_what_the_manifest_names() {
    let root = common::repo_root();
    let out = std::env::temp_dir().join(format!("krew-tag-{}", std::process::id()));
    run(Command::new(root.join("hack/krew"))
        .env("KREW_BIN", common::bin("kubectl-fence"))
        .env("KREW_OUT", &out)
        .env("TAG", "v9.8.7"));
    let text = std::fs::read_to_string(out.join("fence.yaml")).unwrap();
    let m: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(m["spec"]["version"], "v9.8.7");
    assert!(
        m["spec"]["platforms"][0]["uri"]
            .as_str()
            .unwrap()
            .contains("/download/v9.8.7/"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
