// A user's onboarding, as one durable run that lasts days without holding a worker:
// create the account, send the welcome email (a child run of send-welcome-email), wait a
// while, then wait for the user to activate (event "user.activated") and follow up.
// Input {"userId": 42, "email": "ada@example.com", "name": "Ada"} plus, optionally,
// "api" (passed on to send-welcome-email), "pause" ("1h") and "activationTimeout" ("3d").
import {
  task, step, call, sleep, waitForEvent, sendEvent, progress, log, context, FatalError,
} from './wasq.js';

export const run = task(async (input) => {
  const { userId, email, name, api, pause = '1h', activationTimeout = '3d' } = input ?? {};
  if (userId === undefined || !email) throw new FatalError('userId and email are required');
  log.info(`onboarding user ${userId}, attempt ${context().attempt}`);

  // Random ids and clocks belong inside steps: code outside them re-runs on every attempt
  // and resume, and must take the same path each time.
  const account = await step('create-account', () => {
    log.info(`creating the account of ${email}`);
    return { id: `acct_${crypto.randomUUID().slice(0, 8)}`, createdAt: new Date().toISOString() };
  });
  progress(25, 'account created');

  // A child run, started once however often this run is replayed; this run suspends
  // until it ends. If it fails for good, `call` throws a (fatal) ChildFailedError.
  const welcome = await call('welcome', 'send-welcome-email', { email, name, api });
  progress(50, 'welcome email sent');

  // Durable: the wake-up time is fixed the first time the run gets here; a long pause
  // ends the attempt and frees the worker until it is due.
  await sleep('cool-off', pause);
  progress(60, 'waiting for activation');

  // Only "user.activated" events for this user count; null when the timeout passes first.
  const activation = await waitForEvent('activation', 'user.activated', {
    if: { user_id: userId },
    timeout: activationTimeout,
  });

  const followUp = await step('follow-up', () => {
    const what = activation ? 'tips' : 'reminder';
    log.info(`sending the ${what} email to ${email}`);
    return what;
  });
  // Starts whatever is subscribed to it (an analytics task, say), once per run.
  await sendEvent('finished', 'onboarding.finished', { user_id: userId, activated: !!activation });
  progress(100, 'done');

  return {
    userId,
    account: account.id,
    welcomeMessageId: welcome.messageId,
    activated: activation !== null,
    plan: activation?.plan ?? null,
    followUp,
  };
});
