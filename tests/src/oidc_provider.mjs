// A certified OpenID Provider (npm `oidc-provider`) on loopback for the dashboard's single
// sign-on tests (tests/src/oidc.rs): one static confidential client, PKCE required, and the
// library's development login (any login name is an account; that name is the email, verified).
// Usage: NODE_MODULES=<dir> node oidc_provider.mjs PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI
// (imported by path: an ES module does not resolve packages through NODE_PATH).
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const entry = join(process.env.NODE_MODULES, 'oidc-provider/lib/index.js');
const { default: Provider } = await import(pathToFileURL(entry).href);

const [port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'] },
  // The ID token carries the email claims itself (the gateway reads no userinfo).
  conformIdTokenClaims: false,
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, email: id, email_verified: true }),
  }),
  features: { devInteractions: { enabled: true } },
});
provider.listen(Number(port), '127.0.0.1', () => console.log(`listening on ${port}`));
