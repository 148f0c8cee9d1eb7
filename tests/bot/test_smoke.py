from tests.bot.helpers import REPO, pr_payload


def test_label_smoke(world):
    p = pr_payload("labeled", number=2, head_sha=world.shas["feature"], base_sha=world.shas["main"],
                   label="optimize-kernels")
    r = world.post("pull_request", p)
    assert r.status_code == 202, r.text
    assert world.drain() == 1
    jobs = world.jobs()
    assert len(jobs) == 1, world.ctx.store.delivery_counts()
    print(jobs[0])
    print(world.fake.calls)
    print(world.fake.check_runs)
    assert jobs[0].repo == REPO
