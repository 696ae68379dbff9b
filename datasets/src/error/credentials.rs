//! A profile of the shared AWS files that an S3 client cannot take its credentials from: one
//! variant of the crate's [`super::Error`], `Error::Credentials`.

use std::path::PathBuf;

/// Why the credentials of an AWS profile could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// `AWS_PROFILE` (or `AWS_DEFAULT_PROFILE`) names a profile neither shared file holds.
    #[error(
        "{variable}={profile} names a profile that neither {} nor {} holds",
        credentials.display(),
        config.display()
    )]
    UnknownProfile {
        /// The variable that named it.
        variable: &'static str,
        /// The profile asked for.
        profile: String,
        /// The credentials file looked in.
        credentials: PathBuf,
        /// The config file looked in.
        config: PathBuf,
    },

    /// The profile's credentials come from a process, single sign-on or an assumed role, which
    /// the S3 client does not run.
    #[error(
        "AWS profile {profile} gets its credentials through `{how}` ({}), which Stoker does not \
         run: export them before the run (`eval \"$(aws configure export-credentials --profile \
         {profile} --format env)\"`), or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        path.display()
    )]
    Unsupported {
        /// The profile.
        profile: String,
        /// The setting that sources its credentials (`credential_process`, `sso_session`...).
        how: String,
        /// The file that says so.
        path: PathBuf,
    },

    /// The profile has one of the two keys.
    #[error("AWS profile {profile} has {present} but no {missing}")]
    Incomplete {
        /// The profile.
        profile: String,
        /// The key it has.
        present: &'static str,
        /// The key it lacks.
        missing: &'static str,
    },

    /// A shared file that exists but cannot be read or parsed.
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// What an object store error that came from asking the instance metadata service for a role
/// (the client's last resort, when it found no credentials) means to the user; empty for any
/// other error.
pub(super) fn hint(error: &object_store::Error) -> &'static str {
    if error.to_string().contains("169.254.169.254") {
        "; no credentials were found (no AWS_ACCESS_KEY_ID, no keys in the AWS profile's shared \
         files, no web identity), so the client asked this machine's instance metadata service \
         for a role, which failed: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or \
         AWS_PROFILE), or AWS_SKIP_SIGNATURE=true for a public bucket"
    } else {
        ""
    }
}
