//! The cloud platforms Claude Code runs on, for the agents suite and bench: the fake Bedrock or
//! Vertex AI in front of the provider simulator (`common::cloud`, which checks every request's
//! SigV4 signature or Google token), compactor's configuration for it, and what each side is
//! given. Through compactor, Claude Code skips the platform's auth and sends a client key;
//! compactor signs with its own credentials. Straight at the fake, Claude Code signs in itself:
//! its AWS SDK signs each request, or it sends a Google bearer of its own.

use sha2::Digest;

use crate::clis::Cli;
use crate::common::agents::ADMIN_TOKEN;
use crate::common::cloud::{
    AWS_ACCESS_KEY_ID, AWS_REGION, AWS_SECRET_ACCESS_KEY, BedrockFront, BedrockOverflow, FrontRequest, VertexFront,
    service_account_file,
};
use crate::common::provider::ProviderSim;

/// The client key Claude Code sends through compactor (`ANTHROPIC_AUTH_TOKEN`).
const CLIENT_KEY: &str = "ck-agents-suite-5b1d";
/// The bearer Claude Code sends straight to the fake Vertex AI, which the fake accepts.
const OWN_GOOGLE_TOKEN: &str = "ya29.claude-code-own";

/// A fake platform, running, and what goes with it.
pub enum Platform {
    Bedrock(BedrockFront),
    Vertex { front: VertexFront, _dir: tempfile::TempDir, key_file: String },
}

impl Platform {
    /// The platform `cli` runs on, in front of `provider`; `None` for the direct APIs.
    pub async fn start(cli: Cli, provider: &ProviderSim) -> Option<Self> {
        match cli {
            Cli::ClaudeCodeBedrock => {
                Some(Self::Bedrock(BedrockFront::start(provider.url(), BedrockOverflow::NamesWindow).await))
            }
            Cli::ClaudeCodeVertex => {
                let front = VertexFront::start(provider.url()).await;
                front.accept_token(OWN_GOOGLE_TOKEN);
                let dir = tempfile::tempdir().expect("temp dir");
                let key_file = service_account_file(dir.path(), &front.token_uri()).to_string_lossy().into_owned();
                Some(Self::Vertex { front, _dir: dir, key_file })
            }
            _ => None,
        }
    }

    /// Where the agent goes when it goes straight at the platform.
    pub fn url(&self) -> String {
        match self {
            Self::Bedrock(front) => front.url(),
            Self::Vertex { front, .. } => front.url(),
        }
    }

    /// What the fake received, and whether it let each through.
    pub fn requests(&self) -> Vec<FrontRequest> {
        match self {
            Self::Bedrock(front) => front.requests(),
            Self::Vertex { front, .. } => front.requests(),
        }
    }

    /// compactor's configuration: the platform's upstream, the client key, the admin API, `extra`.
    pub fn compactor_config(&self, provider: &ProviderSim, extra: &str) -> String {
        let digest: String = sha2::Sha256::digest(CLIENT_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let upstream = match self {
            Self::Bedrock(front) => format!("bedrock = \"{}\"\nbedrock_region = \"{AWS_REGION}\"", front.url()),
            Self::Vertex { front, .. } => format!("vertex = \"{}\"", front.url()),
        };
        format!(
            "[upstream]\nanthropic = \"{}\"\n{upstream}\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n[clients.agents-suite]\nkey_sha256 = \"{digest}\"\n{extra}",
            provider.url()
        )
    }

    /// compactor's own credentials for the platform, in its environment.
    pub fn compactor_env(&self) -> Vec<(&str, &str)> {
        match self {
            Self::Bedrock(_) => vec![
                ("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID),
                ("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY),
                ("AWS_EC2_METADATA_DISABLED", "true"),
                ("AWS_CONFIG_FILE", "/nonexistent/aws-config"),
                ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials"),
            ],
            Self::Vertex { key_file, .. } => vec![("GOOGLE_APPLICATION_CREDENTIALS", key_file.as_str())],
        }
    }

    /// What Claude Code is given: through compactor, the platform's skip-auth switch and the
    /// client key; straight at the fake, credentials of its own.
    pub fn agent_env(&self, through_compactor: bool) -> Vec<(String, String)> {
        let pairs: Vec<(&str, &str)> = match (self, through_compactor) {
            (Self::Bedrock(_), true) => vec![
                ("CLAUDE_CODE_SKIP_BEDROCK_AUTH", "1"),
                ("ANTHROPIC_AUTH_TOKEN", CLIENT_KEY),
                ("AWS_REGION", AWS_REGION),
            ],
            (Self::Bedrock(_), false) => vec![
                ("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID),
                ("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY),
                ("AWS_REGION", AWS_REGION),
                ("AWS_EC2_METADATA_DISABLED", "true"),
            ],
            (Self::Vertex { .. }, own) => vec![
                ("CLAUDE_CODE_SKIP_VERTEX_AUTH", "1"),
                ("ANTHROPIC_AUTH_TOKEN", if own { CLIENT_KEY } else { OWN_GOOGLE_TOKEN }),
                ("CLOUD_ML_REGION", "us-east5"),
                ("ANTHROPIC_VERTEX_PROJECT_ID", "proj-test"),
            ],
        };
        pairs.into_iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }
}
