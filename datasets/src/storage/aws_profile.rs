//! An AWS profile of the shared files (`~/.aws/credentials` and `~/.aws/config`, or the files
//! `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` name), in the AWS CLI's layout, read for
//! what an S3 client needs: static keys, the region and an endpoint. object_store's client
//! reads the environment and then asks a web identity, a container or the instance metadata
//! service, never these files, so a laptop's `aws configure` or an `AWS_PROFILE` went unread
//! and the client waited on a metadata service that is not there.
//!
//! The profile is `AWS_PROFILE` (else `AWS_DEFAULT_PROFILE`, else `default`). Keys are looked
//! for in the credentials file first, then in the config file (`[profile NAME]`, or `[default]`).
//! A profile whose credentials come from `credential_process`, single sign-on, an assumed role
//! or a web identity file is refused by name (static keys beside such a setting too: the CLI
//! would not sign with them), since the client runs none of them; a profile named by
//! `AWS_PROFILE` that neither file holds is refused too.

use std::path::{Path, PathBuf};

use ini::{Ini, ParseOption, Properties};

use crate::error::CredentialsError;

/// What a profile gives an S3 client.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Profile {
    /// The key id and secret, both or neither.
    pub keys: Option<(String, String)>,
    /// The session token beside the keys.
    pub session_token: Option<String>,
    /// `region`.
    pub region: Option<String>,
    /// `endpoint_url` (the profile's own, not a service section's).
    pub endpoint_url: Option<String>,
}

/// The settings that source credentials in ways the client does not run, first found first.
const SOURCED: [&str; 5] = [
    "credential_process",
    "sso_session",
    "sso_start_url",
    "role_arn",
    "web_identity_token_file",
];

/// The profile the environment (`var`) selects, from its shared files; `None` when the default
/// profile is used and neither file holds it (or there is no home folder to find them in).
pub(super) fn read_profile(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Profile>, CredentialsError> {
    let asked = ["AWS_PROFILE", "AWS_DEFAULT_PROFILE"]
        .into_iter()
        .find_map(|variable| Some((variable, var(variable).filter(|name| !name.is_empty())?)));
    let name = asked
        .as_ref()
        .map_or_else(|| "default".to_string(), |(_, name)| name.clone());
    let home = var("HOME").filter(|home| !home.is_empty());
    let file = |variable: &str, default: &str| {
        var(variable)
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|home| Path::new(home).join(default)))
    };
    let credentials_path = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
    let config_path = file("AWS_CONFIG_FILE", ".aws/config");
    let credentials = credentials_path.as_deref().map(load).transpose()?.flatten();
    let config = config_path.as_deref().map(load).transpose()?.flatten();
    let in_credentials = credentials
        .as_ref()
        .and_then(|ini| ini.section(Some(name.as_str())));
    // The config file names a profile `[profile NAME]`, the default one `[default]` too.
    let in_config = config.as_ref().and_then(|ini| {
        ini.section(Some(format!("profile {name}").as_str()))
            .or_else(|| ini.section(Some("default")).filter(|_| name == "default"))
    });
    if in_credentials.is_none() && in_config.is_none() {
        return match asked {
            Some((variable, profile)) => Err(CredentialsError::UnknownProfile {
                variable,
                profile,
                credentials: credentials_path.unwrap_or_default(),
                config: config_path.unwrap_or_default(),
            }),
            None => Ok(None),
        };
    }
    // A key in the credentials file wins over the same key in the config file.
    let get = |key: &str| {
        in_credentials
            .and_then(|section| value(section, key))
            .or_else(|| in_config.and_then(|section| value(section, key)))
    };
    let keys = match (get("aws_access_key_id"), get("aws_secret_access_key")) {
        (Some(id), Some(secret)) => Some((id, secret)),
        (Some(_), None) => {
            return Err(incomplete(
                name,
                "aws_access_key_id",
                "aws_secret_access_key",
            ))
        }
        (None, Some(_)) => {
            return Err(incomplete(
                name,
                "aws_secret_access_key",
                "aws_access_key_id",
            ))
        }
        (None, None) => None,
    };
    {
        let sourced = [
            (in_credentials, credentials_path.as_deref()),
            (in_config, config_path.as_deref()),
        ]
        .into_iter()
        .find_map(|(section, path)| {
            let how = SOURCED
                .into_iter()
                .find(|key| section.and_then(|s| value(s, key)).is_some())?;
            Some((how, path?))
        });
        if let Some((how, path)) = sourced {
            return Err(CredentialsError::Unsupported {
                profile: name,
                how: how.to_string(),
                path: path.to_path_buf(),
            });
        }
    }
    Ok(Some(Profile {
        session_token: keys.as_ref().and_then(|_| get("aws_session_token")),
        keys,
        region: get("region"),
        endpoint_url: get("endpoint_url"),
    }))
}

fn incomplete(profile: String, present: &'static str, missing: &'static str) -> CredentialsError {
    CredentialsError::Incomplete {
        profile,
        present,
        missing,
    }
}

/// A key's value, `None` when missing or empty. Keys of a nested section (indented under a
/// service's name, `s3 =` then `  endpoint_url = ...`) keep their indentation, so they never
/// read as the profile's own.
fn value(section: &Properties, key: &str) -> Option<String> {
    section
        .get(key)
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .map(str::to_string)
}

/// The shared file at `path`, `None` when there is none.
fn load(path: &Path) -> Result<Option<Ini>, CredentialsError> {
    let unreadable = |reason: String| CredentialsError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(unreadable(error.to_string())),
    };
    let options = ParseOption {
        // Values as written: a secret may hold any character but whitespace.
        enabled_quote: false,
        enabled_escape: false,
        enabled_indented_mutiline_value: false,
        enabled_preserve_key_leading_whitespace: true,
    };
    Ini::load_from_str_opt(&text, options)
        .map(Some)
        .map_err(|error| unreadable(error.to_string()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A home folder holding `credentials` and `config` (when given) under `.aws/`, and the
    /// environment `vars` beside `HOME`.
    fn read(
        credentials: Option<&str>,
        config: Option<&str>,
        vars: &[(&str, &str)],
    ) -> Result<Option<Profile>, CredentialsError> {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        for (name, text) in [("credentials", credentials), ("config", config)] {
            if let Some(text) = text {
                std::fs::write(home.path().join(".aws").join(name), text).unwrap();
            }
        }
        let mut env: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("HOME".into(), home.path().display().to_string());
        read_profile(&|name| env.get(name).cloned())
    }

    const CREDENTIALS: &str = "\
# written by aws configure
[default]
aws_access_key_id = AKIDEFAULT
aws_secret_access_key = se/cr+et=

[work]
aws_access_key_id=AKIWORK
aws_secret_access_key=worksecret
aws_session_token = tok\\en
";

    const CONFIG: &str = "\
[default]
region = eu-west-1
s3 =
  endpoint_url = http://nested.example

[profile work]
region = us-west-2
endpoint_url = http://127.0.0.1:9000

[profile sso]
sso_session = corp
sso_account_id = 1234

[profile role]
role_arn = arn:aws:iam::1:role/r
source_profile = default

[profile keyed-role]
aws_access_key_id = AKIROLE
aws_secret_access_key = rolesecret
role_arn = arn:aws:iam::1:role/r
";

    #[test]
    fn the_default_profile_gives_its_keys_and_region() {
        let profile = read(Some(CREDENTIALS), Some(CONFIG), &[]).unwrap().unwrap();
        assert_eq!(
            profile,
            Profile {
                keys: Some(("AKIDEFAULT".into(), "se/cr+et=".into())),
                session_token: None,
                region: Some("eu-west-1".into()),
                // The indented one is the s3 section's, not the profile's.
                endpoint_url: None,
            }
        );
    }

    #[test]
    fn aws_profile_selects_a_named_profile_across_both_files() {
        let profile = read(Some(CREDENTIALS), Some(CONFIG), &[("AWS_PROFILE", "work")])
            .unwrap()
            .unwrap();
        assert_eq!(
            profile,
            Profile {
                keys: Some(("AKIWORK".into(), "worksecret".into())),
                session_token: Some("tok\\en".into()),
                region: Some("us-west-2".into()),
                endpoint_url: Some("http://127.0.0.1:9000".into()),
            }
        );
        let legacy = read(Some(CREDENTIALS), None, &[("AWS_DEFAULT_PROFILE", "work")]).unwrap();
        assert_eq!(legacy.unwrap().keys.unwrap().0, "AKIWORK");
        let missing = read(None, Some(CONFIG), &[("AWS_DEFAULT_PROFILE", "gone")]).unwrap_err();
        assert!(
            missing.to_string().starts_with("AWS_DEFAULT_PROFILE=gone"),
            "{missing}"
        );
        // The config file may name the default profile `[profile default]`.
        let spelled = "[profile default]\nregion = ap-south-1\n";
        let profile = read(None, Some(spelled), &[]).unwrap().unwrap();
        assert_eq!(profile.region.as_deref(), Some("ap-south-1"));
    }

    #[test]
    fn no_files_and_no_profile_asked_is_nothing_to_read() {
        assert_eq!(read(None, None, &[]).unwrap(), None);
        assert_eq!(read(Some("[other]\n"), None, &[]).unwrap(), None);
        // No home folder: nothing looked for.
        assert_eq!(read_profile(&|_| None).unwrap(), None);
    }

    #[test]
    fn a_profile_asked_for_that_no_file_holds_is_refused_by_name() {
        let error = read(
            Some(CREDENTIALS),
            Some(CONFIG),
            &[("AWS_PROFILE", "missing")],
        )
        .unwrap_err();
        assert!(
            matches!(&error, CredentialsError::UnknownProfile { profile, .. } if profile == "missing")
        );
        let text = error.to_string();
        assert!(
            text.contains("credentials") && text.contains("config"),
            "{text}"
        );
    }

    #[test]
    fn credentials_the_client_cannot_make_are_refused_naming_how_they_are_made() {
        // Keys beside a role too: the CLI would assume the role with them, not sign with them.
        for (profile, how) in [
            ("sso", "sso_session"),
            ("role", "role_arn"),
            ("keyed-role", "role_arn"),
        ] {
            let error =
                read(Some(CREDENTIALS), Some(CONFIG), &[("AWS_PROFILE", profile)]).unwrap_err();
            let text = error.to_string();
            assert!(
                text.contains(how) && text.contains("export-credentials"),
                "{text}"
            );
        }
        let process = "[default]\ncredential_process = /bin/vault-creds\n";
        let error = read(None, Some(process), &[]).unwrap_err();
        assert!(error.to_string().contains("credential_process"), "{error}");
    }

    #[test]
    fn a_profile_with_one_key_of_two_is_refused() {
        let half = "[default]\naws_access_key_id = AKI\n";
        let error = read(Some(half), None, &[]).unwrap_err();
        assert!(
            error.to_string().contains("no aws_secret_access_key"),
            "{error}"
        );
    }

    #[test]
    fn the_files_the_environment_names_are_read_instead() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = dir.path().join("creds");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id=A\naws_secret_access_key=B\n",
        )
        .unwrap();
        let vars = [("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap())];
        let profile = read(Some(CREDENTIALS), None, &vars).unwrap().unwrap();
        assert_eq!(profile.keys, Some(("A".into(), "B".into())));
    }
}
