use super::policy::{Mode, Policy};
use super::stored::Stored;
use super::verdict::{judge, Status};
use super::{canonical, Signed, Subject, NAMESPACE};
use ssh_key::private::{Ed25519Keypair, PrivateKey};
use ssh_key::{HashAlg, LineEnding};

const URL: &str = "https://git.example/acme/skills";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const BUNDLE: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from(Ed25519Keypair::from_seed(&[seed; 32]))
}

fn sign(k: &PrivateKey, namespace: &str, msg: &str) -> String {
    k.sign(namespace, HashAlg::Sha512, msg.as_bytes())
        .unwrap()
        .to_pem(LineEnding::LF)
        .unwrap()
}

fn subject(tier: &str) -> Subject<'_> {
    Subject {
        url: URL,
        commit: COMMIT,
        bundle: BUNDLE,
        tier,
    }
}

fn stored(tier: &str, text: String) -> Stored {
    Stored {
        bundle: BUNDLE.into(),
        tier: tier.into(),
        url: URL.into(),
        commit: COMMIT.into(),
        key: String::new(),
        signature: text,
        added_by: "test".into(),
        added_at: 0,
    }
}

fn policy(mode: &str, keys: &[&PrivateKey], tiers: &str) -> Policy {
    let keys: Vec<String> = keys
        .iter()
        .map(|k| format!("{:?}", k.public_key().to_openssh().unwrap()))
        .collect();
    Policy::parse(&format!(
        "[[scope]]\nname = \"acme\"\ntoolkits = [\"https://git.example/acme/*\"]\n{tiers}keys = [{}]\nmode = \"{mode}\"\n",
        keys.join(", ")
    ))
    .unwrap()
}

#[test]
fn a_signature_verifies_only_the_message_it_was_made_for() {
    let k = key(1);
    let text = sign(&k, NAMESPACE, &subject("owner").message());
    let signed = Signed::parse(&text).unwrap();
    assert!(signed.verifies(&subject("owner").message()));
    assert!(!signed.verifies(&subject("workspace").message()));
    assert!(!signed.verifies(&subject("owner").message().replace("acme", "evil")));
    // Another spelling of the same repository names the same thing.
    for same in [
        "https://GIT.example/acme/skills.git",
        "https://git.example:443/acme/skills/",
        "https://git.example/acme/\tskills",
        "https://git.example./acme/skills.GIT",
        "https://git.example//acme//skills",
        "https://git.example/%61cme/skills",
    ] {
        assert_eq!(canonical(same), URL, "{same}");
        let on = Subject {
            url: same,
            ..subject("owner")
        };
        assert!(signed.verifies(&on.message()), "{same}");
    }
    assert_ne!(canonical("https://git.example/ACME/skills"), URL);
    // Its own canonical spelling, whatever it was given.
    for odd in [
        "https://x/a.git.git",
        "https://x/a/.git/.git/",
        "ht\u{1}tps://x/a.git",
        "https://x/a/%2E%2E/b",
        "https://x/%2e%2egit",
        "https://x",
        "mailto:someone",
        "https://x/%252E",
        "foo://HOST./p%7Eq",
        "not a url",
        "hhttps:/\0\0\0/kit%2E/kit.GgITi",
        "foo://kit%2E%2E/x",
        "hps:\0g\u{fffd}i.exa-\u{fffd}----BEGIN /",
        "hps:x.git /",
        "hps:x/ .git /",
        " https://x/a ",
        "httgit.://git.exampAle/%7:cme/kit%2Egit/%2E.git/",
        "https://x/kit.git/%2E.git/",
    ] {
        let once = canonical(odd);
        assert_eq!(canonical(&once), once, "{odd:?}");
        assert!(!once.chars().any(char::is_control), "{odd:?}");
    }
    assert_eq!(
        signed.fingerprint(),
        k.public_key().fingerprint(HashAlg::Sha256).to_string()
    );
}

#[test]
fn text_that_is_not_an_ed25519_bundle_signature_is_refused() {
    let k = key(1);
    let other = sign(&k, "git", "x");
    assert!(Signed::parse(&other)
        .unwrap_err()
        .message
        .contains("namespace"));
    assert!(Signed::parse("not a signature").is_err());
    assert!(Signed::parse(&"A".repeat(super::MAX_TEXT + 1))
        .unwrap_err()
        .message
        .contains("bytes"));
    // One bit of the signature itself flipped (inside the armor): it still
    // parses, as the same key's, and no longer verifies.
    let good = k.sign(NAMESPACE, HashAlg::Sha512, b"x").unwrap();
    let mut raw = good.signature().as_bytes().to_vec();
    raw[10] ^= 1;
    let bad = ssh_key::SshSig::new(
        good.public_key().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        ssh_key::Signature::new(ssh_key::Algorithm::Ed25519, raw).unwrap(),
    )
    .unwrap()
    .to_pem(LineEnding::LF)
    .unwrap();
    let parsed = Signed::parse(&bad).unwrap();
    assert_eq!(
        parsed.fingerprint(),
        Signed::parse(&good.to_pem(LineEnding::LF).unwrap())
            .unwrap()
            .fingerprint()
    );
    assert!(!parsed.verifies("x"));
    assert!(Signed::parse(&good.to_pem(LineEnding::LF).unwrap())
        .unwrap()
        .verifies("x"));
}

#[test]
fn a_policy_is_judged_scope_by_scope() {
    let (trusted, other) = (key(1), key(2));
    let good = sign(&trusted, NAMESPACE, &subject("owner").message());
    let require = policy("require", &[&trusted], "");

    let v = judge(&require, subject("owner"), &[stored("owner", good.clone())]);
    assert_eq!(v.status, Status::Verified);
    assert!(v.served());
    assert_eq!(v.keys.len(), 1);

    let v = judge(&require, subject("owner"), &[]);
    assert_eq!((v.status, v.served()), (Status::Unsigned, false));

    let by_other = sign(&other, NAMESPACE, &subject("owner").message());
    let v = judge(&require, subject("owner"), &[stored("owner", by_other)]);
    assert_eq!((v.status, v.served()), (Status::UntrustedKey, false));

    // Signed for the owner tier, stored as the workspace tier's: it signs other facts.
    let v = judge(
        &require,
        subject("workspace"),
        &[stored("workspace", good.clone())],
    );
    assert_eq!((v.status, v.served()), (Status::Bad, false));

    let warn = policy("warn", &[&trusted], "");
    let v = judge(&warn, subject("owner"), &[]);
    assert_eq!(
        (v.status, v.served(), v.mode),
        (Status::Unsigned, true, Some(Mode::Warn))
    );

    // A scope covers every spelling of a repository its pattern names.
    for spelling in [
        "https://GIT.EXAMPLE/acme/skills",
        "https://git.example:443/ACME/skills.git",
    ] {
        let on = Subject {
            url: spelling,
            ..subject("owner")
        };
        assert_eq!(
            judge(&require, on, &[]).status,
            Status::Unsigned,
            "{spelling}"
        );
    }

    // A scope for the owner tier only says nothing of the workspace tier.
    let owner_only = policy("require", &[&trusted], "tiers = [\"owner\"]\n");
    let v = judge(&owner_only, subject("workspace"), &[]);
    assert_eq!((v.status, v.served()), (Status::NotRequired, true));
    let v = judge(&Policy::default(), subject("owner"), &[]);
    assert_eq!(v.status, Status::NotRequired);
}

#[test]
fn require_outranks_warn_when_both_cover_a_toolkit() {
    let (a, b) = (key(1), key(2));
    let text = format!(
        "[[scope]]\ntoolkits = [\"*\"]\nkeys = [{:?}]\nmode = \"warn\"\n\n[[scope]]\ntoolkits = [\"https://git.example/*\"]\nkeys = [{:?}]\nmode = \"require\"\n",
        a.public_key().to_openssh().unwrap(),
        b.public_key().to_openssh().unwrap()
    );
    let p = Policy::parse(&text).unwrap();
    let by_a = sign(&a, NAMESPACE, &subject("owner").message());
    let v = judge(&p, subject("owner"), &[stored("owner", by_a)]);
    assert_eq!(
        (v.status, v.mode, v.served()),
        (Status::UntrustedKey, Some(Mode::Require), false)
    );
    assert!(v.problems[0].contains("scope 2"), "{:?}", v.problems);
}

#[test]
fn a_bad_policy_is_refused_with_its_reason() {
    let k = key(1).public_key().to_openssh().unwrap();
    for (text, why) in [
        ("[[scope]]\ntoolkits = [\"*\"]\nkeys = []\nmode = \"require\"\n", "no key"),
        (&*format!("[[scope]]\ntoolkits = [\"*\"]\nkeys = [{k:?}]\nmode = \"maybe\"\n"), "maybe"),
        (&*format!("[[scope]]\ntoolkits = [\"*\"]\ntiers = [\"builtin\"]\nkeys = [{k:?}]\nmode = \"warn\"\n"), "tier"),
        ("[[scope]]\ntoolkits = [\"*\"]\nkeys = [\"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ x\"]\nmode = \"warn\"\n", "key"),
        ("[[scope]]\ntoolkits = [\"*\"]\nkeys = [\"x\"]\nmode = \"warn\"\nextra = 1\n", "extra"),
    ] {
        let e = Policy::parse(text).unwrap_err();
        assert!(e.message.contains(why), "{text}: {}", e.message);
    }
}

#[test]
fn a_removed_signature_stays_removed_until_its_key_signs_again() {
    let home = tempfile::tempdir().unwrap();
    let db = crate::state::Db::open_sqlite(home.path()).unwrap();
    let k = key(1);
    let text = sign(&k, NAMESPACE, &subject("owner").message());
    let added = super::stored::add(&db, subject("owner"), &text, "test").unwrap();
    assert_eq!(
        super::stored::of_subject(&db, subject("owner"))
            .unwrap()
            .len(),
        1
    );
    super::stored::remove(&db, BUNDLE, "owner", &added.key, None, "test").unwrap();
    assert!(super::stored::of_bundle(&db, BUNDLE).unwrap().is_empty());
    // The same signature found again (in a bucket) is not taken back.
    assert!(!super::stored::import(&db, subject("owner"), &text, |_| true).unwrap());
    assert!(super::stored::of_bundle(&db, BUNDLE).unwrap().is_empty());
    assert!(super::stored::remove(&db, BUNDLE, "owner", &added.key, None, "test").is_err());
    // Signed again by its key: kept again.
    super::stored::add(&db, subject("owner"), &text, "test").unwrap();
    assert_eq!(super::stored::of_bundle(&db, BUNDLE).unwrap().len(), 1);
    // An import takes only what verifies and what the caller trusts.
    let other = sign(&key(2), NAMESPACE, &subject("owner").message());
    assert!(!super::stored::import(&db, subject("owner"), &other, |_| false).unwrap());
    let wrong = sign(&key(2), NAMESPACE, &subject("workspace").message());
    assert!(!super::stored::import(&db, subject("owner"), &wrong, |_| true).unwrap());
    assert!(super::stored::import(&db, subject("owner"), &other, |_| true).unwrap());
    assert_eq!(super::stored::of_bundle(&db, BUNDLE).unwrap().len(), 2);
}
