// Browser tests of the creditd console, run by console/browser_test.go
// (`node --test`) against a real creditd it starts. Each test saves a
// screenshot under $SCREENSHOTS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (run through go test ./console)`);
  return v;
};
const base = env('CONSOLE_URL');
const shots = env('SCREENSHOTS');
const tenantID = env('TENANT_ID');
const customerID = env('CUSTOMER_ID');
const customerPath = `/console/t/${tenantID}/live/customers/${customerID}`;

let browser;

before(async () => {
  // launch() runs Chromium on a fresh temporary --user-data-dir of its own
  // (removed at close) and passes --headless; each test then opens a new
  // context, so sessions never leak between tests.
  browser = await chromium.launch({
    executablePath: env('CHROMIUM'),
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

after(async () => {
  await browser?.close();
});

// page opens a fresh context (its own cookies) with a console-wide guard:
// any console response carrying a CSP with unsafe-inline fails the test.
async function newPage(opts = {}) {
  const context = await browser.newContext({ baseURL: base, viewport: { width: 1280, height: 900 }, ...opts });
  const page = await context.newPage();
  page.on('response', (r) => {
    const csp = r.headers()['content-security-policy'];
    if (r.url().includes('/console') && csp && csp.includes('unsafe-inline')) {
      throw new Error(`CSP allows unsafe-inline on ${r.url()}`);
    }
  });
  return page;
}

async function signIn(page, credential) {
  await page.goto('/console/login');
  await page.getByLabel('Admin token or API key').fill(credential);
  await page.getByRole('button', { name: 'Sign in' }).click();
  try {
    await page.waitForURL((u) => !u.pathname.endsWith('/login'), { timeout: 15000 });
  } catch {
    assert.fail(`sign-in failed: ${await page.locator('main').innerText()}`);
  }
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true });
}

async function api(method, path, key, body, idem) {
  const headers = { 'X-API-Key': key, 'Content-Type': 'application/json' };
  if (idem) headers['Idempotency-Key'] = idem;
  const r = await fetch(base + path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

// sendTwice sends form, as filled in on the page, twice at once with the
// page's cookies: a double click whose two posts both reach the server (a
// browser sends the second when the first answer is slow) or a resubmit.
async function sendTwice(page, form) {
  const fields = {};
  for (const el of await form.locator('[name]').all()) {
    if ((await el.getAttribute('type')) === 'checkbox' && !(await el.isChecked())) continue;
    fields[await el.getAttribute('name')] = await el.inputValue();
  }
  const action = new URL(await form.getAttribute('action'), page.url()).href;
  const post = () => page.context().request.post(action, { form: fields, maxRedirects: 0 });
  for (const r of await Promise.all([post(), post()])) assert.equal(r.status(), 303, `post to ${action}`);
}

// formWith is the form holding the submit button named name.
const formWith = (page, name) => page.locator('form').filter({ has: page.getByRole('button', { name }) });

// eventually retries check (reloading the page first) until it passes.
async function eventually(page, check, what, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      await check();
      return;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`${what}: ${last?.message}`);
    await new Promise((r) => setTimeout(r, 300));
    await page.reload();
  }
}

test('sign-in works from the keyboard alone and signs the operator in', async () => {
  const page = await newPage();
  await page.goto('/console/login');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
  await shot(page, '00-sign-in');
  // Keyboard only: skip link, brand link, then the credential field; Enter submits.
  await page.keyboard.press('Tab');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement?.id), 'credential');
  await page.keyboard.type(env('ADMIN_TOKEN'));
  await page.keyboard.press('Enter');
  await page.waitForURL('**/console/tenants');
  assert.match(page.url(), /\/console\/tenants$/);
  await assert.doesNotReject(page.getByRole('heading', { name: 'Tenants', exact: true }).waitFor());
  await shot(page, '01-tenants');
  await page.context().close();
});

test('operator creates a tenant and a key, each shown once', async () => {
  const page = await newPage();
  await signIn(page, env('ADMIN_TOKEN'));
  await page.getByLabel('Name').fill('Initech <i>');
  await page.getByRole('button', { name: 'Create tenant' }).click();
  await page.getByRole('heading', { name: 'Initech <i>' }).waitFor();
  const keys = await page.getByTestId('secret').innerText();
  assert.match(keys, /live: ck_live_[0-9A-Za-z]{32,}/);
  assert.match(keys, /sandbox: ck_test_[0-9A-Za-z]{32,}/);
  await shot(page, '02-tenant-created');

  await page.getByLabel('Environment').selectOption('sandbox');
  await page.getByRole('button', { name: 'Create key' }).click();
  const key = await page.getByTestId('secret').innerText();
  assert.match(key, /^ck_test_[0-9A-Za-z]{32,}$/);
  assert.equal(await page.locator('tbody tr').filter({ hasText: 'sandbox' }).count(), 2);
  await shot(page, '03-key-created');
  await page.reload();
  assert.equal(await page.getByTestId('secret').count(), 0, 'a key is shown only once');

  // The new key signs a tenant in.
  const tenantPage = await newPage();
  await signIn(tenantPage, key);
  assert.match(tenantPage.url(), /\/sandbox\/customers$/);
  await tenantPage.context().close();

  // Revoking it signs that browser out at once.
  const revoke = page.getByRole('button', { name: /^Revoke key/ }).first();
  await revoke.click();
  await page.getByText('Key revoked.').waitFor();
  await page.context().close();
});

test('tenant finds a customer, grants credit, sees the balance and chart move', async () => {
  const page = await newPage();
  await signIn(page, env('TENANT_KEY'));
  assert.match(page.url(), new RegExp(`/console/t/${tenantID}/live/customers$`));
  await page.getByLabel('Search by external id or name').fill('cust-browser');
  await page.getByRole('button', { name: 'Search' }).click();
  await page.waitForURL(`**${customerPath}`);
  assert.equal(await page.getByTestId('balance').innerText(), '5.000');
  const pointsBefore = Number(await page.getByTestId('balance-chart').getAttribute('data-points'));
  const lineBefore = await page.locator('svg.chart polyline').getAttribute('points');
  await shot(page, '04-customer-before-grant');

  await page.getByLabel('Credits (up to 3 decimals)').fill('10');
  await page.getByLabel('Priority (0–255, lower spends first)').fill('3');
  await page.getByLabel('Reason').fill('browser test');
  await page.getByRole('button', { name: 'Grant' }).click();
  await page.getByText('Granted 10.000 credits.').waitFor();
  assert.equal(await page.getByTestId('balance').innerText(), '15.000');
  assert.equal(await page.getByTestId('effective').innerText(), '15.000');
  const pointsAfter = Number(await page.getByTestId('balance-chart').getAttribute('data-points'));
  assert.ok(pointsAfter > pointsBefore, `chart points ${pointsBefore} -> ${pointsAfter}`);
  assert.notEqual(await page.locator('svg.chart polyline').getAttribute('points'), lineBefore);
  const block = page.getByTestId('blocks').locator('tbody tr').filter({ hasText: '10.000' });
  assert.equal(await block.locator('td').nth(3).innerText(), '3', 'the block shows its priority');
  await shot(page, '05-customer-after-grant');
  await page.context().close();
});

test('a consume through the API appears in the ledger', async () => {
  const key = env('TENANT_KEY');
  let r = await api('POST', '/v1/metering-rules', key, { billable_metric_key: 'tokens', cost_type: 'per_unit', unit_cost: 7 }, 'rule-tokens');
  assert.equal(r.status, 201, JSON.stringify(r.body));
  r = await api('POST', '/v1/entitlements/consume', key, { customer_id: 'cust-browser', billable_metric_key: 'tokens', units: 100 }, 'consume-1');
  assert.equal(r.status, 200, JSON.stringify(r.body));

  const page = await newPage();
  await signIn(page, key);
  await page.goto(customerPath);
  const row = page.getByTestId('ledger').locator('tbody tr').filter({ hasText: 'consumption' });
  await eventually(page, async () => assert.equal(await row.count(), 1), 'consumption row');
  assert.match(await row.innerText(), /-0\.700/);
  assert.match(await row.innerText(), /tokens/);
  assert.match(await page.locator('.legend').innerText(), /tokens: 0\.700/, 'the usage chart has the metric');
  assert.equal(await page.getByTestId('usage-chart').locator('rect').count(), 1);
  assert.match(await page.getByTestId('entitlements').innerText(), /tokens/);
  // The type filter keeps only that row.
  await page.getByLabel('Type').selectOption('consumption');
  await page.getByRole('button', { name: 'Filter' }).click();
  assert.equal(await page.getByTestId('ledger').locator('tbody tr').count(), 1);
  await shot(page, '06-ledger-consumption');
  await page.context().close();
});

test('a metadata value <script> shows as text', async () => {
  const page = await newPage();
  await signIn(page, env('TENANT_KEY'));
  await page.goto(customerPath);
  assert.equal(await page.getByTestId('meta-note').innerText(), '<script>window.pwned=1</script>');
  assert.equal(await page.locator('script').count(), 0);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
  await shot(page, '07-metadata-escaped');
  await page.getByRole('link', { name: 'Settings' }).click();
  await page.getByLabel('Default overage policy').selectOption('notify');
  await page.getByLabel('Low-balance threshold in credits (0: off)').fill('2.5');
  await page.getByRole('button', { name: 'Save settings' }).click();
  await page.getByText('Settings saved.').waitFor();
  assert.equal(await page.getByLabel('Low-balance threshold in credits (0: off)').inputValue(), '2.500');
  await shot(page, '07-settings');
  await page.context().close();
});

test("a tenant cannot open another tenant's customer by URL", async () => {
  const page = await newPage();
  await signIn(page, env('OTHER_KEY'));
  let resp = await page.goto(customerPath);
  assert.equal(resp.status(), 404);
  assert.equal(await page.getByText('5.000').count(), 0);
  // Nor by putting the customer under its own tenant's path.
  resp = await page.goto(`/console/t/${env('OTHER_TENANT_ID')}/live/customers/${customerID}`);
  assert.equal(resp.status(), 404);
  await shot(page, '08-other-tenant-refused');
  // Its own customer opens.
  resp = await page.goto(`/console/t/${env('OTHER_TENANT_ID')}/live/customers/${env('OTHER_CUSTOMER_ID')}`);
  assert.equal(resp.status(), 200);
  await page.context().close();
});

test('a broken webhook fails, and once fixed a redelivery succeeds', async () => {
  const page = await newPage();
  await signIn(page, env('ADMIN_TOKEN'));
  const hookPage = `/console/t/${tenantID}/live/webhook`;
  await page.goto(hookPage);
  await page.getByLabel('URL (empty removes the endpoint)').fill(env('HOOK_BROKEN_URL'));
  await page.getByRole('button', { name: 'Save URL' }).click();
  await page.getByText('Webhook URL saved.').waitFor();
  assert.match(await page.getByTestId('secret').innerText(), /^whsec_/);
  await page.getByRole('button', { name: 'Send a test ping' }).click();
  await page.getByText(/Test ping .* queued/).waitFor();
  const ping = page.getByTestId('events').locator('li.event').filter({ hasText: 'test.ping' }).first();
  await eventually(page, async () => assert.equal(await ping.getAttribute('data-status'), 'dead_letter'), 'ping dead-lettered');
  const attempts = ping.locator('.attempts tbody tr');
  assert.equal(await attempts.count(), 7);
  assert.match(await attempts.first().innerText(), /connection_refused/);
  assert.match(await ping.innerText(), /last error: connection_refused/);
  await shot(page, '09-webhook-failing');

  await page.getByLabel('URL (empty removes the endpoint)').fill(env('HOOK_OK_URL'));
  await page.getByRole('button', { name: 'Save URL' }).click();
  await page.getByText('Webhook URL saved.').waitFor();
  await ping.getByRole('button', { name: /^Redeliver event/ }).click();
  await page.getByText(/queued for redelivery/).waitFor();
  await eventually(page, async () => assert.equal(await ping.getAttribute('data-status'), 'delivered'), 'ping delivered');
  assert.match(await ping.locator('.attempts tbody tr').last().textContent(), /204/);
  await shot(page, '10-webhook-redelivered');

  await page.getByRole('button', { name: 'Rotate signing secret' }).click();
  assert.match(await page.getByTestId('secret').innerText(), /^whsec_/);
  await page.context().close();
});

test('tenant creates a plan with a variant and a grant', async () => {
  const page = await newPage();
  await signIn(page, env('TENANT_KEY'));
  await page.getByRole('link', { name: 'Plans' }).click();
  await page.getByLabel('Name').fill('Pro');
  // A double click sends the form twice; its form key creates one plan
  // (issue 31 item 4).
  await page.getByRole('button', { name: 'Create plan' }).dblclick();
  await page.getByText('Plan Pro created.').waitFor();
  await page.reload();
  assert.equal(await page.locator('section.card h2').filter({ hasText: /^Pro\b/ }).count(), 1, 'a double-clicked plan form made one plan');
  // Every create form's two posts of one rendering, both reaching the
  // server, create one thing (a Chromium double click often sends one).
  await page.getByText('Add a variant').click();
  await page.getByLabel('Trial days').fill('14');
  await sendTwice(page, formWith(page, 'Add variant'));
  await page.reload();
  assert.equal(await page.locator('h3').filter({ hasText: '14-day trial' }).count(), 1, 'a variant form sent twice made one variant');
  await page.getByText('Add a grant to this variant').click();
  await page.getByLabel('Credits', { exact: true }).fill('250');
  await sendTwice(page, formWith(page, 'Add grant'));
  await page.reload();
  assert.match(await page.locator('main').innerText(), /recurring\s+250\.000\s+billing_period/);
  assert.equal(await page.locator('tbody tr').filter({ hasText: /recurring\s*250\.000/ }).count(), 1, 'a grant form sent twice made one grant');
  await page.locator('#plan-name').fill('Team');
  await sendTwice(page, formWith(page, 'Create plan'));
  await page.reload();
  assert.equal(await page.locator('section.card h2').filter({ hasText: /^Team\b/ }).count(), 1, 'a plan form sent twice made one plan');
  await shot(page, '11-plans');
  await page.context().close();
});

test('readable at phone width in dark mode', async () => {
  const page = await newPage({ viewport: { width: 390, height: 844 }, colorScheme: 'dark' });
  await signIn(page, env('TENANT_KEY'));
  await page.goto(customerPath);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert.ok(overflow <= 1, `page is ${overflow}px wider than a phone`);
  const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
  assert.equal(bg, 'rgb(17, 19, 23)', 'dark mode background');
  await shot(page, '12-phone-dark');
  await page.context().close();
});

test('operator overview draws rates from the server metrics', async () => {
  const page = await newPage();
  await signIn(page, env('ADMIN_TOKEN'));
  await page.goto('/console/overview');
  for (let i = 0; i < 3; i++) {
    await new Promise((r) => setTimeout(r, 1100));
    await api('GET', '/v1/tenant', env('TENANT_KEY'));
    await page.reload();
  }
  assert.ok(await page.locator('svg.chart').count() >= 1, 'overview has charts');
  assert.match(await page.locator('main').innerText(), /creditd_persister_lag_seconds/);
  await shot(page, '13-overview');
  await page.context().close();
});
