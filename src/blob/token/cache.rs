//! One cached token per client, refreshed before it expires.
//!
//! A token is used until `margin` before its expiry, or until half its life
//! is left when it came with less than twice the margin to live (else a
//! short-lived token would be fetched anew for every request); then the
//! first caller refreshes it while the others keep using the old one (still
//! valid), so a refresh never stalls a mount. Only when no valid token is
//! left do callers wait, and then they all wait for the same single request.
//! A token the service rejected is dropped with [`TokenCache::invalidate`]
//! so the next caller fetches a new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::{AccessToken, Secret, TokenError, TokenProvider};

/// The longest a fetched token is used before it is fetched again.
const MAX_TOKEN_LIFE: Duration = Duration::from_secs(24 * 3600);
/// Refresh this long before a token expires (what the Azure SDKs do).
pub const DEFAULT_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// A token is only handed out while it has at least this long to live.
const MIN_LIFE: Duration = Duration::from_secs(2);

/// The token in use and when to replace it.
#[derive(Clone, Debug)]
struct Cached {
    access: AccessToken,
    /// Replace it once this little life is left: the margin, or half the
    /// life it had when fetched if that is less.
    refresh_when_left: Duration,
}

/// The token cache of one client.
#[derive(Debug)]
pub struct TokenCache {
    provider: Arc<dyn TokenProvider>,
    margin: Duration,
    current: Mutex<Option<Cached>>,
    refresh: tokio::sync::Mutex<()>,
    fetches: AtomicU64,
}

impl TokenCache {
    /// A cache over `provider` that refreshes `margin` before expiry.
    pub fn new(provider: Arc<dyn TokenProvider>, margin: Duration) -> Self {
        TokenCache {
            provider,
            margin,
            current: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
            fetches: AtomicU64::new(0),
        }
    }

    /// The source's name, for messages.
    pub fn source_name(&self) -> String {
        self.provider.name()
    }

    /// Tokens fetched so far.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    fn snapshot(&self) -> Option<Cached> {
        self.current
            .lock()
            .expect("token cache lock is never poisoned")
            .clone()
    }

    /// True when `c` should be replaced now.
    fn due(c: &Cached, now: SystemTime) -> bool {
        let left = c.access.expires_at.duration_since(now).unwrap_or_default();
        left <= c.refresh_when_left.max(MIN_LIFE)
    }

    fn usable(t: &AccessToken, now: SystemTime) -> bool {
        t.expires_at.duration_since(now).unwrap_or_default() > MIN_LIFE
    }

    /// A valid token, fetching one when needed.
    pub async fn token(&self, http: &reqwest::Client) -> Result<Secret, TokenError> {
        let now = SystemTime::now();
        let old = self.snapshot();
        if let Some(t) = &old {
            if !Self::due(t, now) {
                return Ok(t.access.token.clone());
            }
        }
        // Due for refresh. If another caller is refreshing and the old token
        // still works, use it rather than wait.
        let _guard = match self.refresh.try_lock() {
            Ok(g) => g,
            Err(_) => match &old {
                Some(t) if Self::usable(&t.access, now) => return Ok(t.access.token.clone()),
                _ => self.refresh.lock().await,
            },
        };
        // Someone may have refreshed while we waited for the lock.
        let now = SystemTime::now();
        let old = self.snapshot();
        if let Some(t) = &old {
            if !Self::due(t, now) {
                return Ok(t.access.token.clone());
            }
        }
        match self.provider.fetch(http).await {
            Ok(mut t) => {
                self.fetches.fetch_add(1, Ordering::Relaxed);
                // Kept at most a day, whatever the answer said: a token a
                // service claims lives for years (by mistake or not) is
                // still asked for again, as a revoked sign-in must show.
                let latest = SystemTime::now() + MAX_TOKEN_LIFE;
                t.expires_at = t.expires_at.min(latest);
                let left = t
                    .expires_at
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tracing::debug!(source = %self.provider.name(), expires_in_s = left.as_secs(), "got an access token");
                let secret = t.token.clone();
                let cached = Cached {
                    access: t,
                    refresh_when_left: self.margin.min(left / 2),
                };
                *self
                    .current
                    .lock()
                    .expect("token cache lock is never poisoned") = Some(cached);
                Ok(secret)
            }
            Err(e) => match old {
                Some(t) if Self::usable(&t.access, SystemTime::now()) => {
                    tracing::warn!(error = %e, "token refresh failed; using the current token until it expires");
                    Ok(t.access.token)
                }
                _ => Err(e),
            },
        }
    }

    /// Forget `used` (the service rejected it) unless it was already replaced.
    pub fn invalidate(&self, used: &Secret) {
        let mut cur = self
            .current
            .lock()
            .expect("token cache lock is never poisoned");
        if cur.as_ref().is_some_and(|t| &t.access.token == used) {
            *cur = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::token::TokenErrorKind;

    #[derive(Debug)]
    struct Counting {
        n: AtomicU64,
        life: Duration,
        delay: Duration,
    }

    #[async_trait::async_trait]
    impl TokenProvider for Counting {
        fn name(&self) -> String {
            "counting".into()
        }
        async fn fetch(&self, _: &reqwest::Client) -> Result<AccessToken, TokenError> {
            tokio::time::sleep(self.delay).await;
            let n = self.n.fetch_add(1, Ordering::SeqCst);
            if self.life.is_zero() {
                return Err(TokenError::new(TokenErrorKind::Refused, "counting", "no"));
            }
            Ok(AccessToken {
                token: Secret::new(format!("token-{n}")),
                expires_at: SystemTime::now() + self.life,
            })
        }
    }

    fn cache(life_s: u64, delay_ms: u64, margin_s: u64) -> (Arc<Counting>, Arc<TokenCache>) {
        let p = Arc::new(Counting {
            n: AtomicU64::new(0),
            life: Duration::from_secs(life_s),
            delay: Duration::from_millis(delay_ms),
        });
        let c = Arc::new(TokenCache::new(p.clone(), Duration::from_secs(margin_s)));
        (p, c)
    }

    /// Make the cached token expire `secs` from now, as if time had passed.
    fn expire_in(c: &TokenCache, secs: u64) {
        let mut cur = c.current.lock().unwrap();
        let cached = cur.as_mut().expect("a token is cached");
        cached.access.expires_at = SystemTime::now() + Duration::from_secs(secs);
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_fetch() {
        let (p, c) = cache(3600, 100, 300);
        let http = reqwest::Client::new();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let c = c.clone();
                let http = http.clone();
                tokio::spawn(async move { c.token(&http).await.unwrap() })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().expose(), "token-0");
        }
        assert_eq!(p.n.load(Ordering::SeqCst), 1);
        assert_eq!(c.fetches(), 1);
    }

    #[tokio::test]
    async fn token_inside_the_margin_is_refreshed_and_invalidate_forces_a_fetch() {
        let (p, c) = cache(3600, 0, 300);
        let http = reqwest::Client::new();
        assert_eq!(c.token(&http).await.unwrap().expose(), "token-0");
        assert_eq!(c.token(&http).await.unwrap().expose(), "token-0");
        // Later: 200 s left, inside the 300-s margin.
        expire_in(&c, 200);
        assert_eq!(c.token(&http).await.unwrap().expose(), "token-1");
        let t = c.token(&http).await.unwrap();
        c.invalidate(&t);
        assert_eq!(c.token(&http).await.unwrap().expose(), "token-2");
        assert_eq!(p.n.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_token_said_to_live_for_years_is_kept_a_day_at_most() {
        let (_, c) = cache(50 * 365 * 24 * 3600, 0, 300);
        let http = reqwest::Client::new();
        c.token(&http).await.unwrap();
        let kept = c.snapshot().expect("cached").access.expires_at;
        let left = kept.duration_since(SystemTime::now()).unwrap();
        assert!(left <= MAX_TOKEN_LIFE, "{left:?}");
    }

    #[tokio::test]
    async fn token_shorter_lived_than_the_margin_is_kept_for_half_its_life() {
        // 10 s of life against a 300-s margin: not refetched on every call.
        let (p, c) = cache(10, 0, 300);
        let http = reqwest::Client::new();
        for _ in 0..5 {
            assert_eq!(c.token(&http).await.unwrap().expose(), "token-0");
        }
        assert_eq!(p.n.load(Ordering::SeqCst), 1);
        // With less than half its life left (but still usable) it is replaced.
        expire_in(&c, 4);
        assert_eq!(c.token(&http).await.unwrap().expose(), "token-1");
        assert_eq!(c.fetches(), 2);
    }

    #[tokio::test]
    async fn failed_first_fetch_is_an_error() {
        let (_, c) = cache(0, 0, 300);
        let e = c.token(&reqwest::Client::new()).await.unwrap_err();
        assert_eq!(e.kind, TokenErrorKind::Refused);
    }
}
